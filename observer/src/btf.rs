//! A minimal reader of the kernel's BTF (/sys/kernel/btf/vmlinux): just enough
//! to find where a member sits inside a kernel struct, the way CO-RE would.
//! The eBPF programs read `sock.sk_err` at that offset; a kernel without BTF
//! loses only what needs it (timeout and unreachable errors).
//!
//! Format: include/uapi/linux/btf.h. aya parses BTF too but does not expose
//! struct members.

use std::path::Path;

use observer_common::{hold::ExeWalk, tls::go::FdWalk, SockTuple, TaskIds, TcpCounters};

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    /// Not BTF, or cut short.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// A kind this reader does not know, so the types after it cannot be walked.
    #[error("unknown BTF kind {0}")]
    UnknownKind(u32),
    /// The struct or member is not there.
    #[error("no member `{member}` in struct `{strukt}`")]
    NotFound { strukt: String, member: String },
    /// The member is a bit field (not byte-addressable).
    #[error("member `{0}` is a bit field")]
    BitField(String),
}

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or(BtfError::Malformed("truncated"))
}

fn str_at(strings: &[u8], off: u32) -> &[u8] {
    let rest = strings.get(off as usize..).unwrap_or(&[]);
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    &rest[..end]
}

/// Bytes of extra data that follow a type of `kind` with `vlen` entries.
fn trailer(kind: u32, vlen: usize) -> Result<usize, BtfError> {
    Ok(match kind {
        1 => 4,                                    // INT
        2 | 7..=12 | 16 | 18 => 0, // PTR FWD TYPEDEF VOLATILE CONST RESTRICT FUNC FLOAT TYPE_TAG
        3 => 12,                   // ARRAY
        4 | 5 => 12 * vlen,        // STRUCT UNION
        6 | 13 => 8 * vlen,        // ENUM FUNC_PROTO
        14 | 17 => 4,              // VAR DECL_TAG
        15 | 19 => 12 * vlen,      // DATASEC ENUM64
        k => return Err(BtfError::UnknownKind(k)), // a newer kernel's kind
    })
}

/// Byte offset of `member` in `struct strukt`, from raw BTF (little endian).
/// A member inside an anonymous struct or union of `strukt` counts as its
/// own (the kernel wraps most of `mm_struct` in one).
pub fn member_offset(btf: &[u8], strukt: &str, member: &str) -> Result<u32, BtfError> {
    Types::parse(btf)?.member(strukt, member)
}

/// The type section, indexed by type id.
struct Types<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Start of each type's record; index 0 stands for id 1.
    starts: Vec<usize>,
}

/// Anonymous structs nest a few levels at most; a loop in bad BTF stops here.
const MAX_NESTING: u32 = 8;

impl<'a> Types<'a> {
    fn parse(btf: &'a [u8]) -> Result<Self, BtfError> {
        if btf.len() < 24 || u16::from_le_bytes([btf[0], btf[1]]) != MAGIC {
            return Err(BtfError::Malformed("bad magic"));
        }
        let hdr_len = u32_at(btf, 4)? as usize;
        let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
        let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
        let types = btf
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Malformed("type section out of bounds"))?;
        let strings = btf
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?;
        let mut starts = Vec::new();
        let mut pos = 0;
        while pos + 12 <= types.len() {
            starts.push(pos);
            let info = u32_at(types, pos + 4)?;
            pos += 12 + trailer((info >> 24) & 0x1f, (info & 0xffff) as usize)?;
        }
        Ok(Self {
            types,
            strings,
            starts,
        })
    }

    /// (name offset, info) of type `id`.
    fn head(&self, id: u32) -> Result<(usize, u32, u32), BtfError> {
        let pos = *id
            .checked_sub(1)
            .and_then(|i| self.starts.get(i as usize))
            .ok_or(BtfError::Malformed("type id out of range"))?;
        Ok((pos, u32_at(self.types, pos)?, u32_at(self.types, pos + 4)?))
    }

    fn member(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let not_found = || BtfError::NotFound {
            strukt: strukt.to_owned(),
            member: member.to_owned(),
        };
        let id = self.struct_named(strukt)?.ok_or_else(not_found)?;
        self.find_member(id, member.as_bytes(), 0, 0)?
            .map(|(off, _)| off)
            .ok_or_else(not_found)
    }

    /// Byte offset of `inner`, a member of member `outer` of `struct
    /// strukt` (a struct or a typedef of one, as `sock.sk_lock`'s
    /// `socket_lock_t`), from the start of `strukt`.
    fn nested_member(&self, strukt: &str, outer: &str, inner: &str) -> Result<u32, BtfError> {
        let not_found = |m: &str| BtfError::NotFound {
            strukt: strukt.to_owned(),
            member: m.to_owned(),
        };
        let id = self.struct_named(strukt)?.ok_or_else(|| not_found(outer))?;
        let (base, ty) = self
            .find_member(id, outer.as_bytes(), 0, 0)?
            .ok_or_else(|| not_found(outer))?;
        let (off, _) = self
            .find_member(self.resolve(ty)?, inner.as_bytes(), 0, 0)?
            .ok_or_else(|| not_found(&format!("{outer}.{inner}")))?;
        Ok(base + off)
    }

    /// The type `id` names once typedefs and qualifiers are looked through.
    fn resolve(&self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..MAX_NESTING {
            let (pos, _, info) = self.head(id)?;
            // TYPEDEF VOLATILE CONST RESTRICT TYPE_TAG point at their type.
            if !matches!((info >> 24) & 0x1f, 8..=11 | 18) {
                return Ok(id);
            }
            id = u32_at(self.types, pos + 8)?;
        }
        Err(BtfError::Malformed("typedef loop"))
    }

    fn struct_named(&self, name: &str) -> Result<Option<u32>, BtfError> {
        self.named(KIND_STRUCT, name)
    }

    /// The id of the first type of `kind` called `name`.
    fn named(&self, kind: u32, name: &str) -> Result<Option<u32>, BtfError> {
        for (i, &pos) in self.starts.iter().enumerate() {
            let info = u32_at(self.types, pos + 4)?;
            if (info >> 24) & 0x1f == kind
                && str_at(self.strings, u32_at(self.types, pos)?) == name.as_bytes()
            {
                return Ok(Some(i as u32 + 1));
            }
        }
        Ok(None)
    }

    /// `member`'s byte offset in the struct or union `id` (which sits at
    /// `base` bits), looking inside its anonymous members too, and its type.
    fn find_member(
        &self,
        id: u32,
        member: &[u8],
        base: u32,
        depth: u32,
    ) -> Result<Option<(u32, u32)>, BtfError> {
        let (pos, _, info) = self.head(id)?;
        let kind = (info >> 24) & 0x1f;
        if depth > MAX_NESTING || !(kind == KIND_STRUCT || kind == KIND_UNION) {
            return Ok(None);
        }
        let kind_flag = info >> 31 == 1;
        for i in 0..(info & 0xffff) as usize {
            let m = pos + 12 + 12 * i;
            let name_off = u32_at(self.types, m)?;
            let raw = u32_at(self.types, m + 8)?;
            let (bit_size, bit_off) = if kind_flag {
                (raw >> 24, raw & 0x00ff_ffff)
            } else {
                (0, raw)
            };
            if name_off == 0 {
                let inner = u32_at(self.types, m + 4)?;
                if let Some(off) = self.find_member(inner, member, base + bit_off, depth + 1)? {
                    return Ok(Some(off));
                }
                continue;
            }
            if str_at(self.strings, name_off) != member {
                continue;
            }
            if bit_size != 0 || !(base + bit_off).is_multiple_of(8) {
                return Err(BtfError::BitField(
                    String::from_utf8_lossy(member).into_owned(),
                ));
            }
            return Ok(Some(((base + bit_off) / 8, u32_at(self.types, m + 4)?)));
        }
        Ok(None)
    }
}

/// Where the socket fields the eBPF programs read sit in the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KernelOffsets {
    /// `struct sock`'s `sk_err`: the errno of a failed connection.
    pub sk_err: u32,
    /// `struct tcp_sock`'s `srtt_us` (smoothed RTT << 3).
    pub srtt_us: u32,
    /// `struct sock`'s `sk_lock.owned`: set while a task holds the socket,
    /// so a packet sent then was sent by that task (0: unknown, sessions
    /// without a descriptor are not tied by their packets).
    pub sk_lock_owned: u32,
    /// `struct tcp_sock`'s byte and segment counters, copied into records
    /// (all 0 when not found: bytes and segments read 0).
    #[serde(skip)]
    pub tcp_counters: TcpCounters,
    /// Where a socket's ports and addresses are, for the raw connection
    /// tracepoint (`family == 0`: not found, the classic one is used).
    #[serde(skip)]
    pub sock_tuple: SockTuple,
    /// Where a task's open files are, to go from a Go connection's file
    /// descriptor to its socket; None: Go connections stay untied.
    #[serde(skip)]
    pub fd_walk: Option<FdWalk>,
    /// Whether `fd_walk` was found (for doctor).
    pub fd_to_socket: bool,
    /// Where a task's executable and terminal are, to hold a new
    /// executable's first process; None: nothing is held.
    #[serde(skip)]
    pub exe_walk: Option<ExeWalk>,
    /// Where a task's ids and name are, for the packet programs on kernels
    /// that refuse them the task helpers (all 0: not found).
    #[serde(skip)]
    pub task_ids: TaskIds,
}

/// Why the running kernel's socket offsets are unknown. The text is what
/// `watch` logs and `doctor` shows (the cause's own words included); the
/// cause stays reachable as the source.
#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    /// The kernel has no BTF file, or it cannot be read.
    #[error("{VMLINUX}: {0}")]
    Read(#[source] std::io::Error),
    /// The file is not BTF this reader can walk.
    #[error("{VMLINUX}: {0}")]
    Parse(#[source] BtfError),
    /// `sock.sk_err` or `tcp_sock.srtt_us` is not where it can be read.
    #[error(transparent)]
    Member(BtfError),
}

/// Which of the tracepoints `names` the running kernel's BTF declares: each
/// tracepoint's prototype is the typedef `btf_trace_<name>`, which is what a
/// raw tracepoint program is handed. (Without tracefs this stands in for its
/// format file.)
pub fn raw_tracepoints_declared(names: &[&'static str]) -> Result<Vec<&'static str>, OffsetsError> {
    let data = std::fs::read(Path::new(VMLINUX)).map_err(OffsetsError::Read)?;
    let types = Types::parse(&data).map_err(OffsetsError::Parse)?;
    declared_in(&types, names).map_err(OffsetsError::Parse)
}

fn declared_in(types: &Types, names: &[&'static str]) -> Result<Vec<&'static str>, BtfError> {
    let mut out = Vec::new();
    for &n in names {
        if types
            .named(KIND_TYPEDEF, &format!("btf_trace_{n}"))?
            .is_some()
        {
            out.push(n);
        }
    }
    Ok(out)
}

/// Reads both offsets from the running kernel's BTF.
pub fn kernel_offsets() -> Result<KernelOffsets, OffsetsError> {
    let data = std::fs::read(Path::new(VMLINUX)).map_err(OffsetsError::Read)?;
    let types = Types::parse(&data).map_err(OffsetsError::Parse)?;
    let get = |s: &str, m: &str| types.member(s, m).map_err(OffsetsError::Member);
    let fd_walk = fd_walk_of(&types)
        .map_err(|e| tracing::warn!("Go TLS connections cannot be tied to their sockets: {e}"))
        .ok();
    let exe_walk = exe_walk_of(&types)
        .map_err(|e| tracing::warn!("new executables cannot be held at exec until probed: {e}"))
        .ok();
    let sk_lock_owned = types
        .nested_member("sock", "sk_lock", "owned")
        .map_err(|e| {
            tracing::warn!("TLS sessions without a descriptor cannot be tied by their packets: {e}")
        })
        .unwrap_or(0);
    let tcp_counters = tcp_counters_of(&types)
        .map_err(|e| tracing::warn!("connections' bytes and segments cannot be read: {e}"))
        .unwrap_or_default();
    let sock_tuple = sock_tuple_of(&types)
        .map_err(|e| {
            tracing::warn!(
                "connections are read from the classic tracepoint record (lost while another \
                 tracing program runs on the same CPU): {e}"
            )
        })
        .unwrap_or_default();
    let task_ids = task_ids_of(&types)
        .map_err(|e| tracing::warn!("packet programs cannot read the current task's ids: {e}"))
        .unwrap_or_default();
    Ok(KernelOffsets {
        sk_err: get("sock", "sk_err")?,
        srtt_us: get("tcp_sock", "srtt_us")?,
        sk_lock_owned,
        tcp_counters,
        sock_tuple,
        fd_to_socket: fd_walk.is_some(),
        fd_walk,
        exe_walk,
        task_ids,
    })
}

fn task_ids_of(t: &Types) -> Result<TaskIds, BtfError> {
    Ok(TaskIds {
        pid: t.member("task_struct", "pid")?,
        tgid: t.member("task_struct", "tgid")?,
        comm: t.member("task_struct", "comm")?,
        _pad: 0,
    })
}

fn tcp_counters_of(t: &Types) -> Result<TcpCounters, BtfError> {
    Ok(TcpCounters {
        bytes_sent: t.member("tcp_sock", "bytes_sent")?,
        bytes_retrans: t.member("tcp_sock", "bytes_retrans")?,
        bytes_received: t.member("tcp_sock", "bytes_received")?,
        data_segs_out: t.member("tcp_sock", "data_segs_out")?,
        data_segs_in: t.member("tcp_sock", "data_segs_in")?,
        sk_flags: t.nested_member("sock", "__sk_common", "skc_flags")?,
    })
}

/// What the classic `sock:inet_sock_set_state` record copies: `sock`'s
/// family, protocol, peer port and addresses, `inet_sock`'s source port and
/// address (an `inet_sock` starts with its `sock`).
fn sock_tuple_of(t: &Types) -> Result<SockTuple, BtfError> {
    let common = |m: &str| t.nested_member("sock", "__sk_common", m);
    Ok(SockTuple {
        family: common("skc_family")?,
        protocol: t.member("sock", "sk_protocol")?,
        dport: common("skc_dport")?,
        sport: t.member("inet_sock", "inet_sport")?,
        saddr: t.member("inet_sock", "inet_saddr")?,
        daddr: common("skc_daddr")?,
        saddr_v6: common("skc_v6_rcv_saddr")?,
        daddr_v6: common("skc_v6_daddr")?,
    })
}

fn fd_walk_of(t: &Types) -> Result<FdWalk, BtfError> {
    Ok(FdWalk {
        task_files: t.member("task_struct", "files")?,
        files_fdt: t.member("files_struct", "fdt")?,
        fdt_max_fds: t.member("fdtable", "max_fds")?,
        fdt_fd: t.member("fdtable", "fd")?,
        file_private_data: t.member("file", "private_data")?,
        socket_sk: t.member("socket", "sk")?,
    })
}

/// task -> mm -> exe_file -> f_inode -> (i_ino, i_sb -> s_dev), and
/// task -> signal -> tty.
fn exe_walk_of(t: &Types) -> Result<ExeWalk, BtfError> {
    Ok(ExeWalk {
        task_mm: t.member("task_struct", "mm")?,
        mm_exe_file: t.member("mm_struct", "exe_file")?,
        file_inode: t.member("file", "f_inode")?,
        inode_ino: t.member("inode", "i_ino")?,
        inode_sb: t.member("inode", "i_sb")?,
        sb_dev: t.member("super_block", "s_dev")?,
        task_signal: t.member("task_struct", "signal")?,
        signal_tty: t.member("signal_struct", "tty")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF blob: an INT, then `struct s { int a; int b; }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0".to_vec();
        let mut types = Vec::new();
        let push = |t: &mut Vec<u8>, v: u32| t.extend_from_slice(&v.to_le_bytes());
        // [1] INT "int": name 1, kind 1, size 4, trailer encoding.
        push(&mut types, 1);
        push(&mut types, 1 << 24);
        push(&mut types, 4);
        push(&mut types, 32);
        // [2] STRUCT "s", 2 members, size 8.
        push(&mut types, 5);
        push(&mut types, (4 << 24) | 2);
        push(&mut types, 8);
        for (name, bits) in [(7u32, 0u32), (9, 32)] {
            push(&mut types, name);
            push(&mut types, 1);
            push(&mut types, bits);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&types);
        b.extend_from_slice(&strings);
        b
    }

    #[test]
    fn finds_members() {
        let b = blob();
        assert_eq!(member_offset(&b, "s", "a"), Ok(0));
        assert_eq!(member_offset(&b, "s", "b"), Ok(4));
        assert!(matches!(
            member_offset(&b, "s", "c"),
            Err(BtfError::NotFound { .. })
        ));
        assert_eq!(
            member_offset(&b[..30], "s", "a"),
            Err(BtfError::Malformed("type section out of bounds"))
        );
        assert_eq!(
            member_offset(b"nope", "s", "a"),
            Err(BtfError::Malformed("bad magic"))
        );
    }

    #[test]
    fn running_kernel_declares_its_tracepoints() {
        if !Path::new(VMLINUX).exists() {
            assert!(std::env::var("CI").is_err(), "CI kernels have BTF");
            eprintln!("SKIPPED: this kernel has no BTF");
            return;
        }
        let names = [
            "inet_sock_set_state",
            "tcp_retransmit_skb",
            "no_such_tracepoint",
        ];
        assert_eq!(
            raw_tracepoints_declared(&names).expect("vmlinux"),
            ["inet_sock_set_state", "tcp_retransmit_skb"]
        );
    }

    #[test]
    fn running_kernel_has_sk_err() {
        if !Path::new(VMLINUX).exists() {
            assert!(std::env::var("CI").is_err(), "CI kernels have BTF");
            eprintln!("SKIPPED: this kernel has no BTF");
            return;
        }
        let off = kernel_offsets().expect("sock.sk_err and tcp_sock.srtt_us in vmlinux BTF");
        // struct sock is hundreds of bytes; sk_err is well inside, int-aligned;
        // tcp_sock embeds struct sock, so srtt_us lies beyond it.
        assert!(
            off.sk_err > 100 && off.sk_err < 2000 && off.sk_err.is_multiple_of(4),
            "{off:?}"
        );
        assert!(
            off.srtt_us > 700 && off.srtt_us.is_multiple_of(4),
            "{off:?}"
        );
        // `sk_lock` (a typedef of an unnamed struct) sits inside struct sock,
        // its `owned` an int after the spinlock.
        assert!(
            off.sk_lock_owned > 100
                && off.sk_lock_owned < 1000
                && off.sk_lock_owned.is_multiple_of(4),
            "{off:?}"
        );
        // The counters sit in tcp_sock beyond its embedded struct sock,
        // the byte counts 8-aligned.
        let c = off.tcp_counters;
        for f in [c.bytes_sent, c.bytes_retrans, c.bytes_received] {
            assert!(f > 700 && f.is_multiple_of(8), "{c:?}");
        }
        assert!(c.sk_flags > 0 && c.sk_flags < 1000, "{c:?}");
        for f in [c.data_segs_out, c.data_segs_in] {
            assert!(f > 700 && f.is_multiple_of(4), "{c:?}");
        }
        // A socket's file keeps the socket behind private_data; a task's
        // file table is a pointer away from the task.
        let w = off.fd_walk.expect("the fd -> socket walk in vmlinux BTF");
        assert!(off.fd_to_socket);
        assert!(
            w.task_files > 100 && w.task_files.is_multiple_of(8),
            "{w:?}"
        );
        assert!(w.file_private_data.is_multiple_of(8), "{w:?}");
        assert!(w.socket_sk.is_multiple_of(8) && w.socket_sk < 64, "{w:?}");
        // mm_struct keeps exe_file inside an anonymous struct: found there.
        let e = off
            .exe_walk
            .expect("the task -> executable walk in vmlinux BTF");
        assert!(e.task_mm > 100 && e.task_mm.is_multiple_of(8), "{e:?}");
        assert!(
            e.mm_exe_file > 0 && e.mm_exe_file.is_multiple_of(8),
            "{e:?}"
        );
        assert!(
            e.file_inode.is_multiple_of(8) && e.inode_sb.is_multiple_of(8),
            "{e:?}"
        );
        assert!(e.signal_tty.is_multiple_of(8), "{e:?}");
    }
}
