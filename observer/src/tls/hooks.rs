//! Which program goes on which library function.

use observer_common::tls::library;

/// A program and the function it hooks.
pub struct Hook {
    pub program: &'static str,
    pub symbol: &'static str,
}

const fn h(program: &'static str, symbol: &'static str) -> Hook {
    Hook { program, symbol }
}

/// Each hit costs a trap (~5 us here) in every process, so only what must be
/// seen from a session's start is here. Not SSL_free nor
/// SSL_set_accept_state: on a busy server they were two more traps per
/// connection, and a session reusing a freed one's pointer is recognised at
/// its first handshake call instead (see observer-ebpf's tls_state). Servers
/// that handshake inside SSL_read (Node.js) get their per-call probes at exec.
const OPENSSL_HANDSHAKE: &[Hook] = &[
    h("tls_handshake", "SSL_do_handshake"),
    h("tls_handshake_ret", "SSL_do_handshake"),
    // Clients: announces programs that handshake inside SSL_read/SSL_write.
    h("ssl_session_begin", "SSL_set_connect_state"),
    h("ssl_ctrl", "SSL_ctrl"),
    h("ssl_set_host_name", "SSL_set_tlsext_host_name"),
];
const OPENSSL_PLAINTEXT: &[Hook] = &[
    h("tls_read", "SSL_read"),
    h("tls_rw_ret", "SSL_read"),
    h("ssl_read_ex", "SSL_read_ex"),
    h("tls_rw_ret", "SSL_read_ex"),
    h("tls_write", "SSL_write"),
    h("tls_rw_ret", "SSL_write"),
    h("ssl_write_ex", "SSL_write_ex"),
    h("tls_rw_ret", "SSL_write_ex"),
];
const GNUTLS_HANDSHAKE: &[Hook] = &[
    h("tls_handshake", "gnutls_handshake"),
    h("tls_handshake_ret", "gnutls_handshake"),
    h("gnutls_server_name_set", "gnutls_server_name_set"),
    h("tls_free", "gnutls_deinit"),
];
const GNUTLS_PLAINTEXT: &[Hook] = &[
    h("tls_read", "gnutls_record_recv"),
    h("tls_rw_ret", "gnutls_record_recv"),
    h("tls_write", "gnutls_record_send"),
    h("tls_rw_ret", "gnutls_record_send"),
];

/// Every TLS program in the object, loaded before the first attach.
pub const PROGRAMS: &[&str] = &[
    "tls_handshake",
    "tls_handshake_ret",
    "tls_read",
    "tls_write",
    "ssl_read_ex",
    "ssl_write_ex",
    "tls_rw_ret",
    "tls_free",
    "ssl_session_begin",
    "ssl_ctrl",
    "ssl_set_host_name",
    "gnutls_server_name_set",
];

pub fn hooks(lib: u8, plaintext: bool) -> &'static [Hook] {
    match (lib == library::GNUTLS, plaintext) {
        (false, false) => OPENSSL_HANDSHAKE,
        (false, true) => OPENSSL_PLAINTEXT,
        (true, false) => GNUTLS_HANDSHAKE,
        (true, true) => GNUTLS_PLAINTEXT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_names_a_known_program() {
        for set in [
            OPENSSL_HANDSHAKE,
            OPENSSL_PLAINTEXT,
            GNUTLS_HANDSHAKE,
            GNUTLS_PLAINTEXT,
        ] {
            for hook in set {
                assert!(PROGRAMS.contains(&hook.program), "{}", hook.program);
            }
        }
        // Plaintext hooks are read/write calls only: nothing the handshake
        // path needs is left to a per-process probe.
        for hook in OPENSSL_PLAINTEXT.iter().chain(GNUTLS_PLAINTEXT) {
            assert!(
                hook.symbol.contains("read")
                    || hook.symbol.contains("write")
                    || hook.symbol.contains("recv")
                    || hook.symbol.contains("send")
            );
        }
    }
}
