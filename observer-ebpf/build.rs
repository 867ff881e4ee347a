use which::which;

/// Rebuild the eBPF object when bpf-linker changes (a new LLVM may change codegen).
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
