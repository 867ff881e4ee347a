//! A task's file descriptors to the kernel's sockets, for the TLS stacks
//! compiled into programs (Go's, rustls): their connection objects hold the
//! socket's descriptor, never the socket.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};

use observer_common::tls::go::FdWalk;

use crate::maps::fd_walk;

#[inline(always)]
fn kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper tolerates any kernel address.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// The socket (`struct sock *`) behind file descriptor `fd` of the current
/// task, through its file table (offsets from BTF). A descriptor that is
/// not a socket gives an address no map knows.
#[inline(always)]
pub fn socket_of(fd: u64) -> Option<u64> {
    let w = fd_walk();
    if w.socket_sk == 0 || w.file_private_data == 0 {
        return None;
    }
    // SAFETY: a helper returning the current task's address.
    let task = unsafe { bpf_get_current_task() };
    let file = file_of(&w, task, fd)?;
    let socket: u64 = kernel(file + u64::from(w.file_private_data))?;
    kernel(socket + u64::from(w.socket_sk))
}

/// The `struct file *` behind descriptor `fd` of `task` (None: no such
/// descriptor, or the walk is unknown).
#[inline(always)]
pub fn file_of(w: &FdWalk, task: u64, fd: u64) -> Option<u64> {
    if w.task_files == 0 {
        return None;
    }
    let files: u64 = kernel(task + u64::from(w.task_files))?;
    let fdt: u64 = kernel(files + u64::from(w.files_fdt))?;
    let max: u32 = kernel(fdt + u64::from(w.fdt_max_fds))?;
    if fd >= u64::from(max) {
        return None;
    }
    let fds: u64 = kernel(fdt + u64::from(w.fdt_fd))?;
    let file: u64 = kernel(fds + fd * 8)?;
    (file != 0).then_some(file)
}
