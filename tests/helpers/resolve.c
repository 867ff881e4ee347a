/* Looks up each name given with getaddrinfo (IPv4) and prints
 * "NAME RC MS": the return code and the call's duration by the program's
 * own clock. Built with musl-gcc by the DNS tests, to be a musl program. */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        struct addrinfo hints, *res = NULL;
        struct timespec a, b;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = getaddrinfo(argv[i], "80", &hints, &res);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%s %d %.3f\n", argv[i], rc,
               (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
        if (res)
            freeaddrinfo(res);
    }
    return 0;
}
