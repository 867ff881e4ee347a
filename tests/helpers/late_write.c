/* Preloaded into late_write_server.py: a write to a socket of at least
 * LATE_WRITE_MIN bytes returns LATE_WRITE_MS after its bytes were sent, as
 * when a loaded host deschedules the writing thread between the system call
 * and its library call's return (SSL_write's, here). Smaller writes (the
 * handshake's records) return at once. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void *, size_t);

ssize_t write(int fd, const void *buf, size_t n)
{
    static write_fn real;
    if (!real)
        real = (write_fn)dlsym(RTLD_NEXT, "write");
    ssize_t sent = real(fd, buf, n);
    const char *ms = getenv("LATE_WRITE_MS");
    const char *min = getenv("LATE_WRITE_MIN");
    struct stat st;
    if (ms && min && sent >= atol(min) && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
        long late = atol(ms);
        struct timespec t = {late / 1000, (late % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    return sent;
}
