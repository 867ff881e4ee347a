//! Functions longer than the house allows (80 lines, from `fn` to its
//! closing brace), outside `#[cfg(test)]` code: part of `cargo xtask
//! imports`' drawing, and held to by the test below.

use std::{fs, path::Path};

use anyhow::{Context as _, Result};
use syn::visit::Visit;

/// The most lines a function of observer/src may take.
pub const MAX_LINES: usize = 80;

/// A function over the limit: file, name, lines.
#[derive(Debug, PartialEq, Eq)]
pub struct Long {
    pub file: String,
    pub name: String,
    pub lines: usize,
}

/// Every function in the `.rs` files below `src` longer than `max` lines.
pub fn over(src: &Path, max: usize) -> Result<Vec<Long>> {
    let mut out = Vec::new();
    for path in crate::imports::rust_files(src)? {
        let text = fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        let file = syn::parse_file(&text).with_context(|| format!("{}", path.display()))?;
        let mut v = Lengths::default();
        v.visit_file(&file);
        let shown = path
            .strip_prefix(src)
            .unwrap_or(&path)
            .display()
            .to_string();
        out.extend(
            v.0.into_iter()
                .filter(|(_, n)| *n > max)
                .map(|(name, lines)| Long {
                    file: shown.clone(),
                    name,
                    lines,
                }),
        );
    }
    out.sort_by_key(|l| std::cmp::Reverse(l.lines));
    Ok(out)
}

#[derive(Default)]
struct Lengths(Vec<(String, usize)>);

fn lines(sig: &syn::Signature, body: &syn::Block) -> usize {
    let start = sig.fn_token.span.start().line;
    let end = body.brace_token.span.close().end().line;
    end.saturating_sub(start) + 1
}

impl<'a> Visit<'a> for Lengths {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !crate::imports::is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !crate::imports::is_test_only(&f.attrs) {
            self.0
                .push((f.sig.ident.to_string(), lines(&f.sig, &f.block)));
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !crate::imports::is_test_only(&f.attrs) {
            self.0
                .push((f.sig.ident.to_string(), lines(&f.sig, &f.block)));
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.0.push((f.sig.ident.to_string(), lines(&f.sig, body)));
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

    use super::*;

    #[test]
    fn no_function_of_observer_src_is_over_the_limit() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../observer/src");
        let long = over(&src, MAX_LINES).unwrap();
        assert!(
            long.is_empty(),
            "functions over {MAX_LINES} lines: {long:?}"
        );
        // The count is real: some functions come close.
        assert!(!over(&src, 40).unwrap().is_empty());
    }

    #[test]
    fn counts_from_fn_to_the_closing_brace_and_skips_tests() {
        let dir = std::env::temp_dir().join(format!("long-fns-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (four, body) = ("    let _x = 1;\n".repeat(4), "    let _x = 1;\n".repeat(5));
        let text = format!(
            "fn six() {{\n{four}}}\nstruct S;\nimpl S {{\n    fn seven(&self) {{\n{body}    \
             }}\n}}\n#[cfg(test)]\nmod tests {{\n    fn long() {{\n{body}{body}    }}\n}}\n"
        );
        fs::write(dir.join("lib.rs"), text).unwrap();
        let found = over(&dir, 6).unwrap();
        assert_eq!(
            found,
            vec![Long {
                file: "lib.rs".into(),
                name: "seven".into(),
                lines: 7
            }]
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
