//! `cargo xtask imports`: the structure drawing of observer/src from its
//! imports, per file and per top-level module, in layers (each module sits
//! above everything it imports), and the import circles and functions over
//! the length limit, if any (it then fails). The tests keep observer/src
//! free of both.
//!
//! An import is a `use` or a `crate::`/`super::` path outside `#[cfg(test)]`
//! code. A path through a `pub use` re-export counts as an import of the file
//! that defines the item, as a reader following it would land there.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use syn::visit::Visit;

/// A module by its path below the crate root (`[]` is lib.rs).
type Module = Vec<String>;

/// The import graph of one crate's source tree.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every module file, with the modules it imports.
    pub edges: BTreeMap<Module, BTreeSet<Module>>,
}

pub fn run(dot: bool, edges: bool) -> Result<()> {
    let src = crate::workspace_root()?.join("observer/src");
    let graph = Graph::read(&src)?;
    let top = graph.top_level();
    if edges {
        for (a, to) in &graph.edges {
            let to: Vec<String> = to.iter().map(name).collect();
            println!("{} -> {}", name(a), to.join(" "));
        }
        return Ok(());
    }
    if dot {
        print!("{}", top.dot());
        return Ok(());
    }
    println!(
        "observer/src: {} files, {} imports; {} top-level modules, {} imports",
        graph.edges.len(),
        graph.count(),
        top.edges.len(),
        top.count()
    );
    println!("top-level modules in layers (each imports only from the layers below it):");
    for (i, layer) in top.layers().iter().enumerate().rev() {
        println!(
            "  {i:>2}: {}",
            layer.iter().map(name).collect::<Vec<_>>().join(" ")
        );
    }
    let circles: Vec<_> = graph.circles().into_iter().chain(top.circles()).collect();
    for c in &circles {
        println!(
            "circle: {}",
            c.iter().map(name).collect::<Vec<_>>().join(" ")
        );
    }
    let long = crate::long_fns::over(&src, crate::long_fns::MAX_LINES)?;
    for l in &long {
        println!("{} lines: {} in {}", l.lines, l.name, l.file);
    }
    if circles.is_empty() && long.is_empty() {
        println!(
            "no import circles; no function over {} lines",
            crate::long_fns::MAX_LINES
        );
        return Ok(());
    }
    bail!(
        "{} import circles, {} functions too long",
        circles.len(),
        long.len()
    )
}

/// `a::b`, or `crate` for the root.
pub fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

impl Graph {
    /// Reads every `.rs` file below `src` (lib.rs the root).
    pub fn read(src: &Path) -> Result<Graph> {
        let mut files = BTreeMap::new();
        for path in rust_files(src)? {
            let text = fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
            let file = syn::parse_file(&text).with_context(|| format!("{}", path.display()))?;
            files.insert(module_of(src, &path), file);
        }
        let test_only = test_only_modules(&files);
        files.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
        let known: BTreeSet<Module> = files.keys().cloned().collect();
        let reexports: BTreeMap<Module, BTreeMap<String, Vec<String>>> = files
            .iter()
            .map(|(m, f)| (m.clone(), reexports_of(f)))
            .collect();
        let resolver = Resolver {
            known: &known,
            reexports: &reexports,
        };
        let mut edges = BTreeMap::new();
        for (m, f) in &files {
            let mut paths = Paths::default();
            paths.visit_file(f);
            let to: BTreeSet<Module> = paths
                .0
                .iter()
                .filter_map(|p| resolver.resolve(m, p, 0))
                .filter(|t| t != m && !t.is_empty())
                .collect();
            edges.insert(m.clone(), to);
        }
        Ok(Graph { edges })
    }

    pub fn count(&self) -> usize {
        self.edges.values().map(BTreeSet::len).sum()
    }

    /// The same graph with each file folded into its top-level module.
    pub fn top_level(&self) -> Graph {
        let top = |m: &Module| -> Module { m.iter().take(1).cloned().collect() };
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (a, to) in &self.edges {
            if a.is_empty() {
                continue;
            }
            let entry = edges.entry(top(a)).or_default();
            entry.extend(to.iter().map(top).filter(|t| *t != top(a)));
        }
        Graph { edges }
    }

    /// Strongly connected components of more than one module (Tarjan).
    pub fn circles(&self) -> Vec<Vec<Module>> {
        let mut t = Tarjan {
            graph: self,
            next: 0,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            found: Vec::new(),
        };
        for m in self.edges.keys() {
            if !t.index.contains_key(m) {
                t.visit(m);
            }
        }
        t.found
    }

    /// Layer 0 imports nothing here; a module's layer is one above the
    /// highest it imports. Assumes no circles (a circle's modules are left
    /// out).
    pub fn layers(&self) -> Vec<Vec<Module>> {
        let mut layer: BTreeMap<&Module, usize> = BTreeMap::new();
        loop {
            let before = layer.len();
            for (m, to) in &self.edges {
                if layer.contains_key(m) {
                    continue;
                }
                let below: Option<Vec<usize>> = to
                    .iter()
                    .filter(|t| self.edges.contains_key(*t))
                    .map(|t| layer.get(t).copied())
                    .collect();
                if let Some(below) = below {
                    layer.insert(m, below.into_iter().map(|l| l + 1).max().unwrap_or(0));
                }
            }
            if layer.len() == before {
                break;
            }
        }
        let mut out = vec![Vec::new(); layer.values().max().map_or(0, |m| m + 1)];
        for (m, l) in layer {
            out[l].push(m.clone());
        }
        out
    }

    /// Graphviz, each module ranked by its layer.
    pub fn dot(&self) -> String {
        let mut s = String::from("digraph observer {\n  rankdir=BT;\n  node [shape=box];\n");
        for (i, layer) in self.layers().iter().enumerate() {
            let names: Vec<String> = layer.iter().map(|m| format!("\"{}\"", name(m))).collect();
            s += &format!("  {{ rank=same; /* layer {i} */ {} }}\n", names.join(" "));
        }
        for (a, to) in &self.edges {
            for b in to {
                s += &format!("  \"{}\" -> \"{}\";\n", name(a), name(b));
            }
        }
        s + "}\n"
    }
}

pub fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(out)
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; lib.rs and main.rs the root.
fn module_of(src: &Path, path: &Path) -> Module {
    let rel = path.strip_prefix(src).unwrap_or(path).with_extension("");
    let mut parts: Module = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// `#[cfg(test)] mod x;` declared in a file: `x`'s file is test code.
fn test_only_modules(files: &BTreeMap<Module, syn::File>) -> Vec<Module> {
    let mut out = Vec::new();
    for (m, f) in files {
        for item in &f.items {
            if let syn::Item::Mod(md) = item {
                if md.content.is_none() && is_test_only(&md.attrs) {
                    let mut child = m.clone();
                    child.push(md.ident.to_string());
                    out.push(child);
                }
            }
        }
    }
    out
}

/// The names a file re-exports (`pub use a::b::X` or `... as Y`), with the
/// path each stands for.
fn reexports_of(f: &syn::File) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for item in &f.items {
        if let syn::Item::Use(u) = item {
            if !matches!(u.vis, syn::Visibility::Inherited) && !is_test_only(&u.attrs) {
                let mut leaves = Vec::new();
                use_paths(&u.tree, &mut Vec::new(), &mut leaves);
                for (alias, path) in leaves {
                    out.insert(alias, path);
                }
            }
        }
    }
    out
}

/// Flattens a use tree into (the name it brings in, its full path).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            if n.ident != "self" {
                path.push(n.ident.to_string());
            }
            out.push((path.last().cloned().unwrap_or_default(), path));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push((r.rename.to_string(), path));
        }
        syn::UseTree::Glob(_) => out.push(("*".into(), prefix.clone())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

/// Every path a file's non-test code names: its use trees and its
/// `crate::`/`super::`/`self::` paths.
#[derive(Default)]
struct Paths(Vec<Vec<String>>);

impl<'a> Visit<'a> for Paths {
    fn visit_item(&mut self, item: &'a syn::Item) {
        let attrs = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_test_only(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        let mut leaves = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut leaves);
        self.0.extend(leaves.into_iter().map(|(_, p)| p));
    }

    /// `pub(super)` and `pub(in crate::x)` name where an item is seen, not
    /// what it uses.
    fn visit_visibility(&mut self, _: &'a syn::Visibility) {}

    fn visit_path(&mut self, p: &'a syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segs
            .first()
            .is_some_and(|s| s == "crate" || s == "super" || s == "self")
        {
            self.0.push(segs);
        }
        syn::visit::visit_path(self, p);
    }
}

struct Resolver<'a> {
    known: &'a BTreeSet<Module>,
    reexports: &'a BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl Resolver<'_> {
    /// The module file a path, named in `from`, lands in (None: outside
    /// this crate).
    fn resolve(&self, from: &Module, path: &[String], depth: usize) -> Option<Module> {
        let (mut full, rest) = match path.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &path[1..]),
            Some("super") => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                (from[..from.len().checked_sub(ups)?].to_vec(), &path[ups..])
            }
            Some("self") => (from.clone(), &path[1..]),
            // A child module named without `self::` (2018 paths).
            Some(first) if self.known.contains(&child(from, first)) => (from.clone(), path),
            _ => return None,
        };
        full.extend(rest.iter().cloned());
        let n = (0..=full.len())
            .rev()
            .find(|n| self.known.contains(&full[..*n].to_vec()))?;
        let module = full[..n].to_vec();
        // Follow a re-export to where the item is defined.
        if let Some(item) = full.get(n) {
            if let Some(target) = self.reexports.get(&module).and_then(|r| r.get(item)) {
                if depth < 8 {
                    if let Some(m) = self.resolve(&module, target, depth + 1) {
                        return Some(m);
                    }
                }
            }
        }
        Some(module)
    }
}

fn child(m: &Module, name: &str) -> Module {
    let mut c = m.clone();
    c.push(name.to_owned());
    c
}

struct Tarjan<'a> {
    graph: &'a Graph,
    next: usize,
    index: BTreeMap<Module, usize>,
    low: BTreeMap<Module, usize>,
    stack: Vec<Module>,
    found: Vec<Vec<Module>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: &Module) {
        self.index.insert(v.clone(), self.next);
        self.low.insert(v.clone(), self.next);
        self.next += 1;
        self.stack.push(v.clone());
        for w in self.graph.edges.get(v).into_iter().flatten() {
            if !self.index.contains_key(w) {
                self.visit(w);
                let lw = self.low[w];
                self.low.entry(v.clone()).and_modify(|l| *l = (*l).min(lw));
            } else if self.stack.contains(w) {
                let iw = self.index[w];
                self.low.entry(v.clone()).and_modify(|l| *l = (*l).min(iw));
            }
        }
        if self.low[v] == self.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = self.stack.pop() {
                let done = w == *v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                self.found.push(comp);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

    use super::*;

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("imports-{}-{}", std::process::id(), files.len()));
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn observer_src_has_no_import_circles() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../observer/src");
        let graph = Graph::read(&src).unwrap();
        assert!(graph.edges.len() > 50, "read {} files", graph.edges.len());
        assert!(graph.count() > 200, "found {} imports", graph.count());
        let files = graph.circles();
        let top = graph.top_level().circles();
        assert!(files.is_empty(), "file import circles: {files:?}");
        assert!(top.is_empty(), "top-level import circles: {top:?}");
    }

    #[test]
    fn circles_through_reexports_and_super_are_found_and_test_code_is_not() {
        let dir = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
            ("a/mod.rs", "mod inner;\npub use inner::Thing;\n"),
            // a::inner imports b through a path; b imports a's re-export.
            (
                "a/inner.rs",
                "pub struct Thing;\nfn f() { crate::b::g(); }\n",
            ),
            ("b.rs", "use crate::a::Thing;\npub fn g() {}\n"),
            // c imports b only in a test: no edge.
            ("c.rs", "#[cfg(test)]\nmod tests { use crate::b::g; }\n"),
        ]);
        let graph = Graph::read(&dir).unwrap();
        let m = |s: &str| -> Module { s.split("::").map(String::from).collect() };
        assert_eq!(graph.edges[&m("b")], BTreeSet::from([m("a::inner")]));
        assert!(graph.edges[&m("c")].is_empty());
        assert_eq!(graph.circles(), vec![vec![m("a::inner"), m("b")]]);
        assert_eq!(graph.top_level().circles(), vec![vec![m("a"), m("b")]]);
    }

    #[test]
    fn layers_put_each_module_above_what_it_imports() {
        let dir = tree(&[
            ("lib.rs", "pub mod low;\npub mod mid;\npub mod high;\n"),
            ("low.rs", "pub fn f() {}\n"),
            ("mid.rs", "pub fn g() { crate::low::f() }\n"),
            ("high.rs", "use crate::{low, mid::g};\n"),
        ]);
        let layers = Graph::read(&dir).unwrap().top_level().layers();
        let names: Vec<Vec<String>> = layers
            .iter()
            .map(|l| l.iter().map(name).collect())
            .collect();
        assert_eq!(names, vec![vec!["low"], vec!["mid"], vec!["high"]]);
    }
}
