//! What the correlator tells the TLS probe manager (and the exec hold reader
//! tells it too): its own file so both senders import it without importing
//! the manager.

use observer_common::hold::HoldEvent;

/// Messages from the correlator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// The process began using TLS.
    TlsProcess(u32),
    /// The kernel saw the process pass the plaintext call-rate limit.
    Busy(u32, u32),
    Exec(u32),
    Exit(u32),
    /// A process stopped at exec: its executable was not looked at yet.
    Held(HoldEvent),
    Stop,
}
