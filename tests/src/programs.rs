//! Which of the observer's eBPF programs the kernel holds: the whole table
//! (`observer::programs`, which a unit test holds equal to the built
//! object), counted by name, for tests that check nothing is left behind.

use std::collections::BTreeMap;

/// The kernel keeps the first 15 bytes of a program's name.
fn kernel_name(n: &str) -> &str {
    &n[..n.len().min(15)]
}

/// Loaded programs whose names are the table's, by kernel name and count.
pub fn loaded() -> BTreeMap<String, usize> {
    let ours: Vec<&str> = observer::programs::PROGRAMS
        .iter()
        .map(|p| kernel_name(p.name))
        .collect();
    let mut m = BTreeMap::new();
    for p in aya::programs::loaded_programs().filter_map(Result::ok) {
        let name = p.name_as_str().unwrap_or("").to_owned();
        if ours.contains(&name.as_str()) {
            *m.entry(name).or_default() += 1;
        }
    }
    m
}

/// The table's programs, by kernel name and count (two names share their
/// first 15 bytes: gethostbyname_r and gethostbyname_r_ret).
pub fn table() -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    // A stand-in is loaded only where its program cannot go (no BTF).
    let used = observer::programs::PROGRAMS
        .iter()
        .filter(|p| !observer::programs::is_stand_in(p.name));
    for p in used {
        *m.entry(kernel_name(p.name).to_owned()).or_default() += 1;
    }
    m
}

pub fn minus(a: &BTreeMap<String, usize>, b: &BTreeMap<String, usize>) -> BTreeMap<String, usize> {
    a.iter()
        .filter_map(|(k, &n)| {
            let d = n.saturating_sub(b.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The programs once they have stayed the same for 300 ms (at most 5 s).
pub fn settled() -> BTreeMap<String, usize> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = loaded();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = loaded();
        if now == last || std::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}
