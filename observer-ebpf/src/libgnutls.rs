//! Uprobes specific to GnuTLS's API.

use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use observer_common::tls::library;

use crate::tls_state::set_server_name;

/// `gnutls_server_name_type_t` of a DNS host name.
const GNUTLS_NAME_DNS: i32 = 1;

/// gnutls_server_name_set(session, type, name, len). GnuTLS callers pass
/// NUL-terminated names in practice; the read stops at the NUL or the buffer.
/// Only GnuTLS has it: no cookie needed.
#[uprobe]
pub fn gnutls_server_name_set(ctx: ProbeContext) -> u32 {
    if let (Some(session), Some(kind), Some(name)) =
        (ctx.arg::<u64>(0), ctx.arg::<i32>(1), ctx.arg::<u64>(2))
    {
        if kind == GNUTLS_NAME_DNS && session != 0 && name != 0 {
            set_server_name(session, name, library::GNUTLS);
        }
    }
    0
}
