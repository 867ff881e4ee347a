//! Go executables: where a Go program's crypto/tls functions are, and where
//! the struct fields its probes read lie.
//!
//! Go links its TLS statically and exports nothing, so the dynamic symbols
//! that `elf.rs` reads say nothing; the probes go on the program itself.
//! What is read, cheapest first (the caller asks about every executable it
//! sees mapped, and almost none are Go):
//! - `.go.buildinfo`, which every Go executable since 1.13 carries: its
//!   absence answers "not Go" after the ELF header alone; its content is the
//!   Go version;
//! - the functions' addresses and sizes: `.symtab`, else Go's own function
//!   table (`.gopclntab`), which `-ldflags=-s` keeps since the runtime needs it
//!   for stack traces and stack growth;
//! - the RET instructions of each function, decoded with iced-x86: Go moves
//!   goroutine stacks, which breaks uretprobes (they swap the return address
//!   on the stack), so a uprobe on every RET takes their place;
//! - the offsets of the fields the probes read: DWARF when the build kept it,
//!   else a table of the layouts of known Go versions.

use std::{borrow::Cow, fs::File, path::Path};

use iced_x86::{Code, Decoder, DecoderOptions, Instruction};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::elf::file_offset;

/// An ELF file read from a mapping.
type Elf<'d> = object::File<'d, &'d [u8]>;

/// The functions probed, by their Go symbol names.
pub const READ: &str = "crypto/tls.(*Conn).Read";
pub const WRITE: &str = "crypto/tls.(*Conn).Write";
pub const CLIENT_HANDSHAKE: &str = "crypto/tls.(*Conn).clientHandshake";
pub const SERVER_HANDSHAKE: &str = "crypto/tls.(*Conn).serverHandshake";
pub const FUNCTIONS: &[&str] = &[READ, WRITE, CLIENT_HANDSHAKE, SERVER_HANDSHAKE];

/// The oldest Go supported: 1.17 brought the register-based calling
/// convention on amd64, which the probes read arguments and results from.
pub const MIN_MINOR: u32 = 17;

/// A probed function, by file offsets (what uprobes attach to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoFunction {
    pub name: &'static str,
    /// File offset of the function's first instruction (what a uprobe attaches to).
    pub entry: u64,
    /// File offsets of every RET instruction inside the function's body
    /// (Go forbids return probes: its stacks move; these take their place).
    pub returns: Vec<u64>,
}

/// Byte offsets of the struct fields the probes read (amd64): the kernel
/// map's value type itself.
pub use observer_common::tls::go::GoOffsets;

/// Where the offsets came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OffsetsSource {
    Dwarf,
    /// The fields the DWARF describes from it, the rest from the table (Go
    /// writes DWARF only for the types its compile units name: a program
    /// that reaches crypto/tls.Conn only through net/http has no entry for
    /// it).
    DwarfAndTable,
    VersionTable,
}

/// Where the functions' addresses came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SymbolSource {
    Symtab,
    Pclntab,
}

/// A Go executable that links crypto/tls, ready to be probed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoImage {
    /// As the build info says, e.g. "go1.19.8".
    pub version: String,
    /// Those of [`FUNCTIONS`] found, in that order ([`READ`] and [`WRITE`]
    /// always).
    pub functions: Vec<GoFunction>,
    pub offsets: GoOffsets,
    pub offsets_from: OffsetsSource,
    pub symbols_from: SymbolSource,
}

impl GoImage {
    /// The function named `name` (one of [`FUNCTIONS`]), if the program has it.
    pub fn function(&self, name: &str) -> Option<&GoFunction> {
        self.functions.iter().find(|f| f.name == name)
    }
}

/// Why a file could not be read ([`GoError::Open`], [`GoError::Parse`]), or
/// why a Go executable cannot be probed (the others: see [`GoError::is_go`]).
#[derive(Debug, thiserror::Error)]
pub enum GoError {
    #[error("opening {0}: {1}")]
    Open(String, std::io::Error),
    #[error("{0} is not an ELF file we can read: {1}")]
    Parse(String, object::Error),
    #[error("{path}: unreadable Go build info: {why}")]
    BuildInfo { path: String, why: BuildInfoError },
    #[error("{version}: not supported: {why}")]
    Unsupported { version: String, why: &'static str },
    /// A Go program that does not link crypto/tls's Read and Write: the
    /// common case, nothing to report loudly.
    #[error("{version}: crypto/tls is not linked in")]
    NoTls { version: String },
    #[error("{version}: no symbol table, and no usable function table: {why}")]
    NoFunctionTable {
        version: String,
        #[source]
        why: PclntabError,
    },
    #[error("{version}: {name} lies outside the file's loaded segments")]
    BadFunction { version: String, name: &'static str },
    #[error("{version}: no DWARF, and the struct layout of this Go version is not known")]
    UnknownLayout { version: String },
}

impl GoError {
    /// Whether the file is a Go executable: false only when it could not be
    /// read as an ELF file at all.
    pub fn is_go(&self) -> bool {
        !matches!(self, GoError::Open(..) | GoError::Parse(..))
    }

    /// The Go version, where the build info was read.
    pub fn version(&self) -> Option<&str> {
        match self {
            GoError::Unsupported { version, .. }
            | GoError::NoTls { version }
            | GoError::NoFunctionTable { version, .. }
            | GoError::BadFunction { version, .. }
            | GoError::UnknownLayout { version } => Some(version),
            GoError::Open(..) | GoError::Parse(..) | GoError::BuildInfo { .. } => None,
        }
    }
}

/// Reads `path`: `Ok(None)` when it is an ELF file but not a Go executable
/// (decided from the section headers alone), `Ok(Some)` for a Go program
/// that can be probed, `Err` otherwise ([`GoError::is_go`] tells "unreadable"
/// from "Go, but not probed").
pub fn inspect(path: &Path) -> Result<Option<GoImage>, GoError> {
    let show = || path.display().to_string();
    let file = File::open(path).map_err(|e| GoError::Open(show(), e))?;
    // SAFETY: a read-only private mapping; a file truncated under us would
    // fault, which executables that processes have mapped are not.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GoError::Open(show(), e))?;
    let obj = object::File::parse(&*map).map_err(|e| GoError::Parse(show(), e))?;
    let version = match go_version(&obj, &map) {
        None => return Ok(None),
        Some(Err(why)) => return Err(GoError::BuildInfo { path: show(), why }),
        Some(Ok(v)) => v,
    };
    let minor = supported(&obj, &version)?;
    let (spans, symbols_from) = function_spans(&obj, &version)?;
    let functions = spans
        .iter()
        .map(|span| {
            locate(&obj, &map, span).ok_or_else(|| GoError::BadFunction {
                version: version.clone(),
                name: span.name,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (offsets, offsets_from) = match (dwarf_fields(&obj), table_offsets(minor)) {
        (found, _) if found.iter().all(Option::is_some) => (
            from_fields(found.map(|f| f.unwrap_or_default())),
            OffsetsSource::Dwarf,
        ),
        (found, Some(table)) if found.iter().any(Option::is_some) => {
            let mut values = fields(&table);
            for (v, f) in values.iter_mut().zip(found) {
                if let Some(f) = f {
                    *v = f;
                }
            }
            (from_fields(values), OffsetsSource::DwarfAndTable)
        }
        (_, Some(table)) => (table, OffsetsSource::VersionTable),
        (_, None) => return Err(GoError::UnknownLayout { version }),
    };
    Ok(Some(GoImage {
        version,
        functions,
        offsets,
        offsets_from,
        symbols_from,
    }))
}

// ---------------------------------------------------------------------------
// The Go version: .go.buildinfo

/// The first 14 bytes of `.go.buildinfo` (Go's linker writes the blob at the
/// start of that section).
const BUILDINFO_MAGIC: &[u8] = b"\xff Go buildinf:";
/// Flag bit: the version string is inline (Go 1.18+), not behind pointers.
const BUILDINFO_INLINE: u8 = 2;
/// Flag bit: pointers are big-endian (pre-1.18 layout only).
const BUILDINFO_BIG_ENDIAN: u8 = 1;
/// Longer than any Go version string; bounds what a corrupt length reads.
const MAX_VERSION_LEN: u64 = 256;

/// Why `.go.buildinfo` could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildInfoError {
    #[error("truncated")]
    Truncated,
    #[error("bad magic")]
    BadMagic,
    #[error("pointer size {0}")]
    PointerSize(u8),
    #[error("the version string is not in the file")]
    Unmapped,
    #[error("the version string is not UTF-8")]
    NotUtf8,
    #[error("empty version string")]
    Empty,
}

/// None when the file has no `.go.buildinfo`: not a Go executable.
fn go_version<'d>(obj: &Elf<'d>, map: &'d [u8]) -> Option<Result<String, BuildInfoError>> {
    let section = obj.section_by_name(".go.buildinfo")?;
    let Ok(blob) = section.data() else {
        return Some(Err(BuildInfoError::Truncated));
    };
    Some(parse_build_info(blob, |addr, len| {
        read_at(obj, map, addr, len)
    }))
}

/// `len` bytes at virtual address `addr`, from the file.
fn read_at<'d>(obj: &Elf<'d>, map: &'d [u8], addr: u64, len: u64) -> Option<&'d [u8]> {
    let start = usize::try_from(file_offset(obj, addr)?).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    map.get(start..end)
}

/// The Go version from the build-info blob. Go 1.18+ writes it inline (a
/// uvarint length and the bytes, at offset 32); 1.17 writes the address of
/// `runtime.buildVersion`'s string header at offset 16, which `read` resolves
/// (virtual address, length -> bytes).
fn parse_build_info<'m>(
    blob: &[u8],
    read: impl Fn(u64, u64) -> Option<&'m [u8]>,
) -> Result<String, BuildInfoError> {
    let header = blob.get(..32).ok_or(BuildInfoError::Truncated)?;
    if header.get(..BUILDINFO_MAGIC.len()) != Some(BUILDINFO_MAGIC) {
        return Err(BuildInfoError::BadMagic);
    }
    let (ptr_size, flags) = match header.get(14..16) {
        Some(&[p, f]) => (p, f),
        _ => return Err(BuildInfoError::Truncated),
    };
    let bytes = if flags & BUILDINFO_INLINE != 0 {
        let rest = blob.get(32..).ok_or(BuildInfoError::Truncated)?;
        let (len, n) = uvarint(rest).ok_or(BuildInfoError::Truncated)?;
        let len = usize::try_from(len).map_err(|_| BuildInfoError::Truncated)?;
        rest.get(n..n.saturating_add(len))
            .ok_or(BuildInfoError::Truncated)?
    } else {
        let size = match ptr_size {
            4 | 8 => usize::from(ptr_size),
            other => return Err(BuildInfoError::PointerSize(other)),
        };
        let big = flags & BUILDINFO_BIG_ENDIAN != 0;
        let word = |b: &[u8], at: usize| {
            b.get(at..at + size)
                .and_then(|w| uint(w, big))
                .ok_or(BuildInfoError::Truncated)
        };
        let string_header =
            read(word(header, 16)?, 2 * size as u64).ok_or(BuildInfoError::Unmapped)?;
        let (ptr, len) = (word(string_header, 0)?, word(string_header, size)?);
        if len > MAX_VERSION_LEN {
            return Err(BuildInfoError::Unmapped);
        }
        read(ptr, len).ok_or(BuildInfoError::Unmapped)?
    };
    let version = std::str::from_utf8(bytes).map_err(|_| BuildInfoError::NotUtf8)?;
    if version.is_empty() {
        return Err(BuildInfoError::Empty);
    }
    Ok(version.to_owned())
}

/// An unsigned LEB128 number (Go's uvarint) and the bytes it took.
fn uvarint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        let low = u64::from(b & 0x7f);
        let shifted = low.checked_shl(7 * i as u32)?;
        if i == 9 && b > 1 {
            return None; // more than 64 bits
        }
        value |= shifted;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// A 4- or 8-byte unsigned integer.
fn uint(bytes: &[u8], big_endian: bool) -> Option<u64> {
    match (bytes.len(), big_endian) {
        (4, false) => Some(u64::from(u32::from_le_bytes(bytes.try_into().ok()?))),
        (4, true) => Some(u64::from(u32::from_be_bytes(bytes.try_into().ok()?))),
        (8, false) => Some(u64::from_le_bytes(bytes.try_into().ok()?)),
        (8, true) => Some(u64::from_be_bytes(bytes.try_into().ok()?)),
        _ => None,
    }
}

/// The minor version of a Go version string: "go1.19.8" -> 19,
/// "go1.21rc2" -> 21, "devel go1.22-3f2a5b Tue ..." -> 22.
fn go_minor(version: &str) -> Option<u32> {
    let at = version.find("go1.")?;
    let rest = version.get(at + 4..)?;
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest.get(..digits)?.parse().ok()
}

/// The minor version, if this Go executable can be probed.
fn supported(obj: &Elf<'_>, version: &str) -> Result<u32, GoError> {
    let unsupported = |why| GoError::Unsupported {
        version: version.to_owned(),
        why,
    };
    let minor = go_minor(version).ok_or_else(|| unsupported("unrecognised version string"))?;
    if minor < MIN_MINOR {
        return Err(unsupported(
            "before go1.17: no register-based calling convention to read arguments from",
        ));
    }
    if obj.architecture() != object::Architecture::X86_64 {
        return Err(unsupported("only amd64 executables are probed"));
    }
    Ok(minor)
}

// ---------------------------------------------------------------------------
// The functions: .symtab, else .gopclntab

/// A probed function's code, by virtual address: [start, end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    name: &'static str,
    start: u64,
    end: u64,
}

/// The probed functions present, in [`FUNCTIONS`] order; NoTls unless Read
/// and Write are both there.
fn function_spans(obj: &Elf<'_>, version: &str) -> Result<(Vec<Span>, SymbolSource), GoError> {
    let (mut spans, from) = match symtab_spans(obj) {
        Some(spans) => (spans, SymbolSource::Symtab),
        None => {
            let spans = pclntab_spans(obj).map_err(|why| GoError::NoFunctionTable {
                version: version.to_owned(),
                why,
            })?;
            (spans, SymbolSource::Pclntab)
        }
    };
    let has = |name| spans.iter().any(|s: &Span| s.name == name);
    if !has(READ) || !has(WRITE) {
        return Err(GoError::NoTls {
            version: version.to_owned(),
        });
    }
    spans.sort_by_key(|s| FUNCTIONS.iter().position(|&n| n == s.name));
    Ok((spans, from))
}

/// From `.symtab`: None when the file has none (stripped). Go writes each
/// function's size.
fn symtab_spans(obj: &Elf<'_>) -> Option<Vec<Span>> {
    let mut any = false;
    let mut spans: Vec<Span> = Vec::new();
    for sym in obj.symbols() {
        any = true;
        if sym.kind() != SymbolKind::Text || sym.size() == 0 {
            continue;
        }
        let Ok(bytes) = sym.name_bytes() else {
            continue;
        };
        let Some(&name) = FUNCTIONS.iter().find(|n| n.as_bytes() == bytes) else {
            continue;
        };
        if !spans.iter().any(|s| s.name == name) {
            let start = sym.address();
            let end = start.checked_add(sym.size())?;
            spans.push(Span { name, start, end });
        }
    }
    any.then_some(spans)
}

/// From Go's function table.
fn pclntab_spans(obj: &Elf<'_>) -> Result<Vec<Span>, PclntabError> {
    let (addr, data) = find_pclntab(obj)?;
    let mut table = Pclntab::parse(data)?;
    if table.text_start == 0 && table.format != PclnFormat::Go116 {
        // A PIE whose linker left relocated words zero in the file (lld):
        // the dynamic relocation of that word holds the address.
        let word = addr.checked_add(table.text_start_at as u64);
        table.text_start = word
            .and_then(|w| relative_relocation(obj, w))
            .ok_or(PclntabError::NoTextStart)?;
    }
    table.find(FUNCTIONS)
}

/// The function table and its virtual address. Its own section, but for
/// the external linker's PIEs, which merge it into `.data.rel.ro`: there,
/// its header is searched for.
fn find_pclntab<'d>(obj: &Elf<'d>) -> Result<(u64, &'d [u8]), PclntabError> {
    for name in [".gopclntab", ".data.rel.ro.gopclntab"] {
        if let Some(section) = obj.section_by_name(name) {
            let data = section.data().map_err(|_| PclntabError::Truncated)?;
            return Ok((section.address(), data));
        }
    }
    let section = obj
        .section_by_name(".data.rel.ro")
        .ok_or(PclntabError::Missing)?;
    let data = section.data().map_err(|_| PclntabError::Truncated)?;
    for magic in [GO120_MAGIC, GO118_MAGIC, GO116_MAGIC] {
        let mut needle = [0u8; 6];
        needle[..4].copy_from_slice(&magic.to_le_bytes());
        let found = memchr::memmem::find_iter(data, &needle)
            .filter(|at| at % 8 == 0)
            .find_map(|at| {
                let tail = data.get(at..)?;
                Pclntab::parse(tail).ok().map(|_| (at, tail))
            });
        if let Some((at, tail)) = found {
            return Ok((section.address().saturating_add(at as u64), tail));
        }
    }
    Err(PclntabError::Missing)
}

/// The addend of an R_X86_64_RELATIVE dynamic relocation at `addr`: the
/// value of that word once loaded at base 0.
fn relative_relocation(obj: &Elf<'_>, addr: u64) -> Option<u64> {
    obj.dynamic_relocations()?
        .find(|(at, _)| *at == addr)
        .and_then(|(_, reloc)| match reloc.flags() {
            object::RelocationFlags::Elf { r_type } if r_type == object::elf::R_X86_64_RELATIVE => {
                u64::try_from(reloc.addend()).ok()
            }
            _ => None,
        })
}

/// Why Go's function table could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PclntabError {
    #[error("no .gopclntab")]
    Missing,
    #[error("truncated")]
    Truncated,
    #[error("unknown magic {0:#x}")]
    BadMagic(u32),
    #[error("bad header")]
    BadHeader,
    #[error("entries disagree")]
    Inconsistent,
    #[error("the start of text is not in the file")]
    NoTextStart,
}

/// `runtime.pcHeader.magic` of Go 1.16 and 1.17.
const GO116_MAGIC: u32 = 0xffff_fffa;
/// Go 1.18 and 1.19.
const GO118_MAGIC: u32 = 0xffff_fff0;
/// Go 1.20 and later (the header and the fields read here are 1.18's).
const GO120_MAGIC: u32 = 0xffff_fff1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PclnFormat {
    /// Entries are absolute PCs, pointer-sized.
    Go116,
    /// Entries are 32-bit offsets from the start of text.
    Go118,
}

/// Go's function table (`runtime.pcHeader` and what follows it), as
/// `debug/gosym` and `runtime/symtab.go` describe it. Every read is
/// bounds-checked: the bytes come from the file.
#[derive(Clone, Copy, Debug)]
struct Pclntab<'d> {
    format: PclnFormat,
    ptr_size: usize,
    nfunc: usize,
    /// Where the entry offsets count from (1.18+), as the header says.
    text_start: u64,
    /// Where the header's text-start word is, from the table's start.
    text_start_at: usize,
    /// NUL-terminated names, indexed by each `_func`'s nameOff.
    funcnames: &'d [u8],
    /// The functab (pairs of entry and `_func` offset, then the end of the
    /// last function), followed by the `_func` records; record offsets count
    /// from its start.
    funcdata: &'d [u8],
}

impl<'d> Pclntab<'d> {
    fn parse(data: &'d [u8]) -> Result<Self, PclntabError> {
        let head = data.get(..8).ok_or(PclntabError::Truncated)?;
        let magic = uint(head.get(..4).ok_or(PclntabError::Truncated)?, false)
            .ok_or(PclntabError::Truncated)?;
        let format = match u32::try_from(magic).map_err(|_| PclntabError::Truncated)? {
            GO116_MAGIC => PclnFormat::Go116,
            GO118_MAGIC | GO120_MAGIC => PclnFormat::Go118,
            other => return Err(PclntabError::BadMagic(other)),
        };
        let &[_, _, _, _, pad1, pad2, quantum, ptr_size] = head else {
            return Err(PclntabError::Truncated);
        };
        if pad1 != 0 || pad2 != 0 || !matches!(quantum, 1 | 2 | 4) || !matches!(ptr_size, 4 | 8) {
            return Err(PclntabError::BadHeader);
        }
        let ptr_size = usize::from(ptr_size);
        let word_at = |i: usize| 8 + i * ptr_size;
        let word = |i: usize| -> Result<usize, PclntabError> {
            let at = word_at(i);
            let w = data
                .get(at..at + ptr_size)
                .and_then(|b| uint(b, false))
                .ok_or(PclntabError::Truncated)?;
            usize::try_from(w).map_err(|_| PclntabError::Truncated)
        };
        // Header words: nfunc, nfiles, [textStart (1.18+)], funcnameOffset,
        // cuOffset, filetabOffset, pctabOffset, pclnOffset.
        let skip = usize::from(format == PclnFormat::Go118);
        let nfunc = word(0)?;
        let text_start_at = word_at(2);
        let text_start = if skip == 1 { word(2)? as u64 } else { 0 };
        let funcnames = data.get(word(2 + skip)?..).ok_or(PclntabError::Truncated)?;
        let funcdata = data.get(word(6 + skip)?..).ok_or(PclntabError::Truncated)?;
        let table = Pclntab {
            format,
            ptr_size,
            nfunc,
            text_start,
            text_start_at,
            funcnames,
            funcdata,
        };
        // The whole functab, end entry included, must be there.
        let fields = nfunc
            .checked_mul(2)
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(table.field_size()))
            .ok_or(PclntabError::Truncated)?;
        if funcdata.len() < fields {
            return Err(PclntabError::Truncated);
        }
        Ok(table)
    }

    /// The width of a functab field (and of `_func`'s entry).
    fn field_size(&self) -> usize {
        match self.format {
            PclnFormat::Go116 => self.ptr_size,
            PclnFormat::Go118 => 4,
        }
    }

    /// Field `i` of the functab.
    fn field(&self, i: usize) -> Result<u64, PclntabError> {
        let size = self.field_size();
        let at = i.checked_mul(size).ok_or(PclntabError::Truncated)?;
        self.funcdata
            .get(at..at.saturating_add(size))
            .and_then(|b| uint(b, false))
            .ok_or(PclntabError::Truncated)
    }

    /// The address an entry field holds.
    fn address(&self, field: u64) -> Result<u64, PclntabError> {
        match self.format {
            PclnFormat::Go116 => Ok(field),
            PclnFormat::Go118 => self
                .text_start
                .checked_add(field)
                .ok_or(PclntabError::Inconsistent),
        }
    }

    /// The entry of function `i`; for `i == nfunc`, the end of the last one.
    fn pc(&self, i: usize) -> Result<u64, PclntabError> {
        self.address(self.field(2 * i)?)
    }

    /// Function `i`'s `_func` record (and what follows it).
    fn record(&self, i: usize) -> Result<&'d [u8], PclntabError> {
        let off = usize::try_from(self.field(2 * i + 1)?).map_err(|_| PclntabError::Truncated)?;
        self.funcdata.get(off..).ok_or(PclntabError::Truncated)
    }

    /// The NUL-terminated name a `_func` record names (nameOff follows the
    /// entry field).
    fn name(&self, record: &[u8]) -> Option<&'d [u8]> {
        let at = self.field_size();
        let off = uint(record.get(at..at + 4)?, false)?;
        self.funcnames.get(usize::try_from(off).ok()?..)
    }

    /// The spans of those of `names` present. A function ends where the next
    /// one starts (padding included: INT3s, no RET).
    fn find(&self, names: &[&'static str]) -> Result<Vec<Span>, PclntabError> {
        let mut spans: Vec<Span> = Vec::new();
        for i in 0..self.nfunc {
            let record = self.record(i)?;
            let Some(stored) = self.name(record) else {
                return Err(PclntabError::Truncated);
            };
            let is = |n: &&&str| {
                stored
                    .strip_prefix(n.as_bytes())
                    .is_some_and(|rest| rest.first() == Some(&0))
            };
            let Some(&name) = names.iter().find(is) else {
                continue;
            };
            if spans.iter().any(|s| s.name == name) {
                continue;
            }
            let (start, end) = (self.pc(i)?, self.pc(i + 1)?);
            // The record's own entry must agree with the functab's.
            let own = record
                .get(..self.field_size())
                .and_then(|b| uint(b, false))
                .ok_or(PclntabError::Truncated)?;
            if self.address(own)? != start || end <= start {
                return Err(PclntabError::Inconsistent);
            }
            spans.push(Span { name, start, end });
            if spans.len() == names.len() {
                break;
            }
        }
        Ok(spans)
    }
}

/// The function at `span`, by file offsets; None when its code is not
/// wholly inside one loaded segment of the file.
fn locate(obj: &Elf<'_>, map: &[u8], span: &Span) -> Option<GoFunction> {
    let len = span.end.checked_sub(span.start).filter(|&l| l > 0)?;
    let entry = file_offset(obj, span.start)?;
    // The last byte must be in the same segment, right after the first.
    if file_offset(obj, span.end - 1)? != entry.checked_add(len - 1)? {
        return None;
    }
    let start = usize::try_from(entry).ok()?;
    let code = map.get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
    Some(GoFunction {
        name: span.name,
        entry,
        returns: ret_offsets(code).into_iter().map(|o| entry + o).collect(),
    })
}

/// For the fuzz target (crate::fuzzing): the function table, the build
/// information and the return finder, each on the same arbitrary bytes.
#[cfg(any(test, feature = "fuzzing"))]
pub fn fuzz_tables(data: &[u8]) {
    if let Ok(table) = Pclntab::parse(data) {
        let _ = table.find(&["crypto/tls.(*Conn).Read", "crypto/tls.(*Conn).Write"]);
    }
    let _ = parse_build_info(data, |addr, len| {
        let at = usize::try_from(addr).ok()?;
        data.get(at..)?.get(..usize::try_from(len).ok()?)
    });
    std::hint::black_box(ret_offsets(data));
}

/// The offsets in `code` (amd64 machine code) of its RET instructions,
/// decoded linearly: Go puts no data in functions on amd64 (jump tables live
/// in rodata), so every byte is an instruction. A byte scan for 0xC3 would
/// also hit operand bytes (`mov %rax,%rbx` is 48 89 C3).
fn ret_offsets(code: &[u8]) -> Vec<u64> {
    let Ok(mut decoder) = Decoder::try_with_ip(64, code, 0, DecoderOptions::NONE) else {
        return Vec::new();
    };
    let mut instruction = Instruction::default();
    let mut found = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if matches!(instruction.code(), Code::Retnq | Code::Retnq_imm16) {
            found.push(instruction.ip());
        }
    }
    found
}

// ---------------------------------------------------------------------------
// The offsets: DWARF, else the table

/// The fields read, as (struct, member) in DWARF, in [`GoOffsets`] order.
const FIELDS: [(&str, &str); 9] = [
    ("crypto/tls.Conn", "conn"),
    ("crypto/tls.Conn", "isClient"),
    ("crypto/tls.Conn", "vers"),
    ("crypto/tls.Conn", "config"),
    ("crypto/tls.Conn", "serverName"),
    ("crypto/tls.Config", "ServerName"),
    ("net.conn", "fd"),
    ("net.netFD", "pfd"),
    ("internal/poll.FD", "Sysfd"),
];

/// Offsets from values in [`FIELDS`] order.
const fn from_fields(v: [u32; 9]) -> GoOffsets {
    GoOffsets {
        conn_conn: v[0],
        conn_is_client: v[1],
        conn_vers: v[2],
        conn_config: v[3],
        conn_server_name: v[4],
        config_server_name: v[5],
        net_conn_fd: v[6],
        netfd_pfd: v[7],
        pfd_sysfd: v[8],
        _pad: 0,
    }
}

/// The values of `o` in [`FIELDS`] order.
const fn fields(o: &GoOffsets) -> [u32; 9] {
    [
        o.conn_conn,
        o.conn_is_client,
        o.conn_vers,
        o.conn_config,
        o.conn_server_name,
        o.config_server_name,
        o.net_conn_fd,
        o.netfd_pfd,
        o.pfd_sysfd,
    ]
}

type Reader<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// The fields the DWARF describes, in [`FIELDS`] order (all None when it is
/// absent or unreadable).
fn dwarf_fields(obj: &Elf<'_>) -> [Option<u32>; 9] {
    // Infallible: a missing section is an empty one.
    let Ok(sections) = gimli::DwarfSections::load(|id| dwarf_section(obj, id));
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
    let mut found = [None; 9];
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        if let Err(e) = struct_fields(&dwarf, &unit, &mut found) {
            tracing::debug!("Go DWARF: {e}");
            break;
        }
        if found.iter().all(Option::is_some) {
            break;
        }
    }
    found
}

/// Only the sections needed to walk types and read names: decompressing
/// `.debug_line` and `.debug_loc` would be most of the cost. Absent ones are
/// empty; `section_by_name` also finds Go 1.19's `.zdebug_*`.
fn dwarf_section<'d>(
    obj: &Elf<'d>,
    id: gimli::SectionId,
) -> Result<Cow<'d, [u8]>, std::convert::Infallible> {
    use gimli::SectionId as S;
    let wanted = matches!(
        id,
        S::DebugInfo
            | S::DebugAbbrev
            | S::DebugStr
            | S::DebugStrOffsets
            | S::DebugLineStr
            // gimli reads each unit's line program header with the unit.
            | S::DebugLine
    );
    Ok(wanted
        .then(|| obj.section_by_name(id.name()))
        .flatten()
        .and_then(|s| s.uncompressed_data().ok())
        .unwrap_or(Cow::Borrowed(&[])))
}

/// Fills `found` from the structure types at the top level of `unit` (where
/// Go puts every type).
fn struct_fields(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    found: &mut [Option<u32>; 9],
) -> gimli::Result<()> {
    let mut tree = unit.entries_tree(None)?;
    let root = tree.root()?;
    let mut types = root.children();
    while let Some(node) = types.next()? {
        let entry = node.entry();
        if entry.tag() != gimli::DW_TAG_structure_type {
            continue;
        }
        let Some(name) = die_name(dwarf, unit, entry) else {
            continue;
        };
        if !FIELDS.iter().any(|(s, _)| s.as_bytes() == name) {
            continue;
        }
        let mut members = node.children();
        while let Some(member) = members.next()? {
            let entry = member.entry();
            if entry.tag() != gimli::DW_TAG_member {
                continue;
            }
            let Some(member_name) = die_name(dwarf, unit, entry) else {
                continue;
            };
            let Some(slot) = FIELDS
                .iter()
                .position(|&(s, m)| s.as_bytes() == name && m.as_bytes() == member_name)
            else {
                continue;
            };
            let offset = entry
                .attr_value(gimli::DW_AT_data_member_location)?
                .and_then(|v| v.udata_value())
                .and_then(|v| u32::try_from(v).ok());
            if let Some(f) = found.get_mut(slot) {
                *f = offset;
            }
        }
    }
    Ok(())
}

/// A DIE's DW_AT_name.
fn die_name<'a>(
    dwarf: &gimli::Dwarf<Reader<'a>>,
    unit: &gimli::Unit<Reader<'a>>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, Reader<'a>>,
) -> Option<&'a [u8]> {
    let value = entry.attr_value(gimli::DW_AT_name).ok()??;
    dwarf.attr_string(unit, value).ok().map(|s| s.slice())
}

/// The layouts of known Go versions (amd64), by minor version: (first,
/// last, offsets), for executables without DWARF (`-ldflags=-w`).
///
/// How each row was checked:
/// - 1.17–1.19: 1.19 against the DWARF of a go1.19.8 build (the tests
///   compare this table with DWARF on every run); 1.17 and 1.18 computed by
///   hand from crypto/tls/conn.go and common.go of those releases, whose
///   fields up to `serverName` are 1.19's.
/// - 1.20: computed by hand from the sources (1.20 added
///   `activeCertHandles` before `serverName`; its `atomic.Bool` has the
///   size of 1.19's `uint32`), not checked against a build.
/// - 1.21–1.24: the DWARF of go1.21.13, go1.22.12, go1.23.5 and go1.24.4
///   builds (1.21 added `quic` before `vers`).
/// - 1.25–1.26: the DWARF of go1.25.5 and go1.26.10 builds
///   (`activeCertHandles` gone again).
///
/// `net.conn.fd`, `net.netFD.pfd` and `internal/poll.FD.Sysfd` did not move
/// in any of them. Newer versions get no guess: the Conn layout changed in
/// 1.20, 1.21 and 1.25, so the next one may too.
const LAYOUTS: &[(u32, u32, GoOffsets)] = &[
    (17, 19, from_fields([0, 16, 64, 72, 192, 128, 0, 0, 16])),
    (20, 20, from_fields([0, 16, 64, 72, 216, 128, 0, 0, 16])),
    (21, 24, from_fields([0, 16, 72, 80, 224, 128, 0, 0, 16])),
    (25, 26, from_fields([0, 16, 72, 80, 208, 128, 0, 0, 16])),
];

/// The known layout of Go 1.`minor`.
fn table_offsets(minor: u32) -> Option<GoOffsets> {
    LAYOUTS
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&minor))
        .map(|&(_, _, offsets)| offsets)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
mod tests {
    use std::{
        path::PathBuf,
        process::Command,
        sync::OnceLock,
        time::{Duration, Instant},
    };

    use super::*;

    /// An HTTPS client that also calls tls.Server, so that both handshakes
    /// are linked in (it is built, never run).
    const HTTPS_CLIENT: &str = r#"package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
)

func main() {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{ServerName: "example.com"}}}
	resp, err := client.Get("https://" + os.Args[1])
	fmt.Println(resp, err)
	if len(os.Args) > 2 {
		fmt.Println(tls.Server(nil, nil).Handshake())
	}
}
"#;

    const HELLO: &str = r#"package main

import "fmt"

func main() { fmt.Println("hello") }
"#;

    /// The Go programs, built once per test run.
    struct Builds {
        plain: PathBuf,
        stripped: PathBuf,
        pie: PathBuf,
        hello: PathBuf,
        dir: PathBuf,
    }

    fn builds() -> &'static Builds {
        static BUILDS: OnceLock<Result<Builds, String>> = OnceLock::new();
        match BUILDS.get_or_init(build_all) {
            Ok(b) => b,
            Err(why) => panic!("{why}"),
        }
    }

    fn build_all() -> Result<Builds, String> {
        let root = std::env::temp_dir();
        remove_stale(&root);
        let dir = root.join(format!("observer-golang-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let src = dir.join("src").join(name);
            std::fs::create_dir_all(&src).map_err(|e| e.to_string())?;
            std::fs::write(src.join("main.go"), text).map_err(|e| e.to_string())?;
            Ok(src)
        };
        let client = write("client", HTTPS_CLIENT)?;
        let hello = write("hello", HELLO)?;
        let out = |name: &str| dir.join(name);
        let b = Builds {
            plain: out("client"),
            stripped: out("client-stripped"),
            pie: out("client-pie"),
            hello: out("hello"),
            dir: dir.clone(),
        };
        go_build(&dir, &client, &b.plain, &[])?;
        go_build(&dir, &client, &b.stripped, &["-ldflags=-s -w"])?;
        go_build(&dir, &client, &b.pie, &["-buildmode=pie", "-ldflags=-s -w"])?;
        go_build(&dir, &hello, &b.hello, &[])?;
        // Only the executables are needed from here on.
        let _ = std::fs::remove_dir_all(dir.join("cache"));
        Ok(b)
    }

    /// `go build`, hermetic: no modules, no network, its own cache.
    fn go_build(dir: &Path, src: &Path, out: &Path, flags: &[&str]) -> Result<(), String> {
        let result = Command::new("go")
            .arg("build")
            .args(flags)
            .arg("-o")
            .arg(out)
            .arg(".")
            .current_dir(src)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .output();
        match result {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(
                "the Go toolchain (`go`) is not on PATH: these tests build Go programs \
                 (apt-get install golang-go)"
                    .into(),
            ),
            Err(e) => Err(format!("running go build: {e}")),
            Ok(o) if !o.status.success() => Err(format!(
                "go build {flags:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            )),
            Ok(_) => Ok(()),
        }
    }

    /// Directories of earlier runs whose process is gone.
    fn remove_stale(root: &Path) {
        let Ok(entries) = std::fs::read_dir(root) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("observer-golang-"))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// Inspects `path`, timing the best of a few runs (the first maps cold).
    fn timed(path: &Path) -> (GoImage, Duration) {
        let mut best = Duration::MAX;
        let mut image = None;
        for _ in 0..5 {
            let t = Instant::now();
            let img = inspect(path).unwrap().expect("a Go executable");
            best = best.min(t.elapsed());
            image = Some(img);
        }
        (image.unwrap(), best)
    }

    /// Every RET offset holds a RET opcode.
    fn assert_rets(path: &Path, image: &GoImage) {
        let bytes = std::fs::read(path).unwrap();
        for f in &image.functions {
            assert!(!f.returns.is_empty(), "{}: no RET", f.name);
            for &r in &f.returns {
                let b = bytes[usize::try_from(r).unwrap()];
                assert!(b == 0xc3 || b == 0xc2, "{} RET at {r:#x} is {b:#x}", f.name);
                assert!(r > f.entry, "{}", f.name);
            }
        }
    }

    #[test]
    fn symtab_and_pclntab_agree_and_the_table_matches_dwarf() {
        let b = builds();
        let (plain, t_plain) = timed(&b.plain);
        let (stripped, t_stripped) = timed(&b.stripped);
        eprintln!("inspect: plain {t_plain:?}, stripped {t_stripped:?}");
        eprintln!("{} offsets: {:?}", plain.version, plain.offsets);
        for img in [&plain, &stripped] {
            assert!(img.version.starts_with("go1.19"), "{}", img.version);
            let names: Vec<_> = img.functions.iter().map(|f| f.name).collect();
            assert_eq!(names, FUNCTIONS);
        }
        assert_rets(&b.plain, &plain);
        assert_rets(&b.stripped, &stripped);
        assert_eq!(plain.symbols_from, SymbolSource::Symtab);
        assert_eq!(stripped.symbols_from, SymbolSource::Pclntab);
        // Same code at the same offsets, whichever table found it.
        assert_eq!(plain.functions, stripped.functions);
        assert_eq!(plain.offsets_from, OffsetsSource::Dwarf);
        assert_eq!(stripped.offsets_from, OffsetsSource::VersionTable);
        // The version table against the DWARF of a real build (where the
        // DWARF has them, the DWARF's won).
        assert_eq!(plain.offsets, stripped.offsets);
        assert_eq!(table_offsets(19), Some(plain.offsets));
    }

    /// A PIE, and the same PIE as lld would leave it: the pclntab's
    /// text-start word zero in the file, its value only in a relocation.
    #[test]
    fn pie_and_its_text_start_from_the_relocation() {
        let b = builds();
        let pie = inspect(&b.pie).unwrap().unwrap();
        assert_eq!(pie.symbols_from, SymbolSource::Pclntab);
        assert_eq!(pie.function(READ).map(|f| f.name), Some(READ));
        assert_rets(&b.pie, &pie);

        let mut bytes = std::fs::read(&b.pie).unwrap();
        let at = {
            let obj = object::File::parse(&*bytes).unwrap();
            let (addr, _) = find_pclntab(&obj).unwrap();
            // magic and 4 bytes, then nfunc, nfiles, textStart.
            file_offset(&obj, addr + 8 + 2 * 8).unwrap() as usize
        };
        assert_ne!(bytes[at..at + 8], [0; 8]);
        bytes[at..at + 8].fill(0);
        let copy = b.dir.join("client-pie-unrelocated");
        std::fs::write(&copy, &bytes).unwrap();
        assert_eq!(inspect(&copy).unwrap().unwrap(), pie);
    }

    #[test]
    fn not_go_and_go_without_tls() {
        let me = std::env::current_exe().unwrap();
        assert!(inspect(&me).unwrap().is_none());
        if Path::new("/bin/ls").exists() {
            assert!(inspect(Path::new("/bin/ls")).unwrap().is_none());
        }
        let e = inspect(&builds().hello).unwrap_err();
        assert!(matches!(e, GoError::NoTls { .. }), "{e}");
        assert!(e.is_go());
        assert!(e.version().unwrap().starts_with("go1.19"), "{e}");
    }

    #[test]
    fn unreadable_files_are_errors_not_go() {
        let dir = std::env::temp_dir().join(format!("observer-golang-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = dir.join("text");
        std::fs::write(&text, b"#!/bin/sh\n").unwrap();
        let e = inspect(&text).unwrap_err();
        assert!(matches!(e, GoError::Parse(..)) && !e.is_go(), "{e}");
        let e = inspect(&dir.join("missing")).unwrap_err();
        assert!(matches!(e, GoError::Open(..)) && !e.is_go(), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn go_minor_versions() {
        assert_eq!(go_minor("go1.19.8"), Some(19));
        assert_eq!(go_minor("go1.21rc2"), Some(21));
        assert_eq!(go_minor("go1.21.0 X:boringcrypto"), Some(21));
        assert_eq!(go_minor("devel go1.22-3f2a5b Tue Jan 2 2024"), Some(22));
        assert_eq!(go_minor("go1."), None);
        assert_eq!(go_minor("gopher"), None);
    }

    #[test]
    fn the_table_covers_go_1_17_to_1_26_and_guesses_nothing_newer() {
        for minor in 17..=26 {
            assert!(table_offsets(minor).is_some(), "1.{minor}");
        }
        assert_eq!(table_offsets(16), None);
        assert_eq!(table_offsets(27), None);
    }

    /// RETs by instruction, not by byte: C3 inside `mov %rax,%rbx` is not one.
    #[test]
    fn rets_are_decoded_not_scanned() {
        let code = [
            0x48, 0x89, 0xc3, // mov %rax,%rbx
            0xc3, // ret
            0xc2, 0x08, 0x00, // ret $8
            0xcc, // int3
        ];
        assert_eq!(ret_offsets(&code), vec![3, 4]);
        assert_eq!(ret_offsets(&[]), Vec::<u64>::new());
        assert_eq!(ret_offsets(&[0x0f]), Vec::<u64>::new());
    }

    // -- build info on hand-made bytes

    fn inline_blob(version: &[u8]) -> Vec<u8> {
        let mut b = BUILDINFO_MAGIC.to_vec();
        b.extend([8, BUILDINFO_INLINE]);
        b.resize(32, 0);
        b.push(u8::try_from(version.len()).unwrap());
        b.extend(version);
        b.push(0); // the module info's length
        b
    }

    fn no_memory(_: u64, _: u64) -> Option<&'static [u8]> {
        None
    }

    #[test]
    fn build_info_inline() {
        let blob = inline_blob(b"go1.19.8");
        assert_eq!(parse_build_info(&blob, no_memory).unwrap(), "go1.19.8");
        let mut bad = blob.clone();
        bad[1] = b'X';
        assert_eq!(
            parse_build_info(&bad, no_memory),
            Err(BuildInfoError::BadMagic)
        );
        assert_eq!(
            parse_build_info(&inline_blob(b""), no_memory),
            Err(BuildInfoError::Empty)
        );
        assert_eq!(
            parse_build_info(&inline_blob(b"go\xff"), no_memory),
            Err(BuildInfoError::NotUtf8)
        );
        // A length past the end, and a varint that never ends.
        let mut long = blob.clone();
        long[32] = 100;
        assert_eq!(
            parse_build_info(&long, no_memory),
            Err(BuildInfoError::Truncated)
        );
        let mut endless = blob[..32].to_vec();
        endless.extend([0xff; 12]);
        assert_eq!(
            parse_build_info(&endless, no_memory),
            Err(BuildInfoError::Truncated)
        );
        for len in 0..blob.len() - 1 {
            assert!(parse_build_info(&blob[..len], no_memory).is_err(), "{len}");
        }
    }

    /// Go 1.17: a pointer to the string header of runtime.buildVersion.
    #[test]
    fn build_info_through_pointers() {
        const HEADER: u64 = 0x1000;
        const TEXT: u64 = 0x2000;
        static STRING_LE: [u8; 16] = [0x00, 0x20, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0];
        static STRING_BE: [u8; 8] = [0, 0, 0x20, 0x00, 0, 0, 0, 8];
        let memory_le = |addr: u64, len: u64| match (addr, len) {
            (HEADER, 16) => Some(&STRING_LE[..]),
            (TEXT, 8) => Some(&b"go1.17.2"[..]),
            _ => None,
        };
        let mut blob = BUILDINFO_MAGIC.to_vec();
        blob.extend([8, 0]);
        blob.extend(HEADER.to_le_bytes());
        blob.resize(32, 0);
        assert_eq!(parse_build_info(&blob, memory_le).unwrap(), "go1.17.2");
        assert_eq!(
            parse_build_info(&blob, no_memory),
            Err(BuildInfoError::Unmapped)
        );

        // 32-bit big-endian.
        let memory_be = |addr: u64, len: u64| match (addr, len) {
            (HEADER, 8) => Some(&STRING_BE[..]),
            (TEXT, 8) => Some(&b"go1.17.5"[..]),
            _ => None,
        };
        let mut be = BUILDINFO_MAGIC.to_vec();
        be.extend([4, BUILDINFO_BIG_ENDIAN]);
        be.extend(u32::try_from(HEADER).unwrap().to_be_bytes());
        be.resize(32, 0);
        assert_eq!(parse_build_info(&be, memory_be).unwrap(), "go1.17.5");

        let mut odd = blob.clone();
        odd[14] = 3;
        assert_eq!(
            parse_build_info(&odd, memory_le),
            Err(BuildInfoError::PointerSize(3))
        );
        // A huge length is refused before any read.
        static HUGE: [u8; 16] = [
            0x00, 0x20, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        let huge = |addr: u64, len: u64| (addr == HEADER && len == 16).then_some(&HUGE[..]);
        assert_eq!(parse_build_info(&blob, huge), Err(BuildInfoError::Unmapped));
    }

    #[test]
    fn uvarints() {
        assert_eq!(uvarint(&[0]), Some((0, 1)));
        assert_eq!(uvarint(&[0x96, 0x01]), Some((150, 2)));
        let max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(uvarint(&max), Some((u64::MAX, 10)));
        let over = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(uvarint(&over), None);
        assert_eq!(uvarint(&[0x80]), None);
        assert_eq!(uvarint(&[]), None);
    }

    // -- the function table on hand-made bytes

    /// A function table of `format` with `funcs` (entry field, name) and the
    /// end of the last one; entries are offsets from `text` (1.18) or
    /// absolute (1.16).
    fn pclntab(format: PclnFormat, text: u64, funcs: &[(u64, &str)], end: u64) -> Vec<u8> {
        let (magic, words, field) = match format {
            PclnFormat::Go116 => (GO116_MAGIC, 7, 8),
            PclnFormat::Go118 => (GO120_MAGIC, 8, 4),
        };
        let put = |b: &mut Vec<u8>, v: u64, size: usize| b.extend(&v.to_le_bytes()[..size]);
        let names_at = 8 + words * 8;
        let mut names = Vec::new();
        let mut name_offs = Vec::new();
        for (_, n) in funcs {
            name_offs.push(names.len() as u64);
            names.extend(n.as_bytes());
            names.push(0);
        }
        let pcln_at = (names_at + names.len()).next_multiple_of(8);
        let records_at = (2 * funcs.len() + 1) * field;
        let record_len = 16;
        let mut header = magic.to_le_bytes().to_vec();
        header.extend([0, 0, 1, 8]);
        let mut w = vec![funcs.len() as u64, 1];
        if format == PclnFormat::Go118 {
            w.push(text);
        }
        w.extend([names_at as u64, 0, 0, 0, pcln_at as u64]);
        for v in w {
            put(&mut header, v, 8);
        }
        let mut b = header;
        b.extend(&names);
        b.resize(pcln_at, 0);
        for (i, (entry, _)) in funcs.iter().enumerate() {
            put(&mut b, *entry, field);
            put(&mut b, (records_at + i * record_len) as u64, field);
        }
        put(&mut b, end, field);
        for ((entry, _), name) in funcs.iter().zip(&name_offs) {
            let start = b.len();
            put(&mut b, *entry, field);
            put(&mut b, *name, 4);
            b.resize(start + record_len, 0);
        }
        b
    }

    fn sample(format: PclnFormat) -> Vec<u8> {
        let base = if format == PclnFormat::Go118 {
            0
        } else {
            0x401000
        };
        pclntab(
            format,
            0x401000,
            &[
                (base, "main.main"),
                (base + 0x40, READ),
                (base + 0x100, "crypto/tls.(*Conn).ReadMore"),
                (base + 0x180, WRITE),
            ],
            base + 0x200,
        )
    }

    #[test]
    fn pclntab_finds_functions_in_both_formats() {
        for format in [PclnFormat::Go118, PclnFormat::Go116] {
            let bytes = sample(format);
            let table = Pclntab::parse(&bytes).unwrap();
            assert_eq!(table.format, format);
            let spans = table.find(FUNCTIONS).unwrap();
            assert_eq!(
                spans,
                [
                    Span {
                        name: READ,
                        start: 0x401040,
                        end: 0x401100
                    },
                    Span {
                        name: WRITE,
                        start: 0x401180,
                        end: 0x401200
                    },
                ],
                "{format:?}"
            );
        }
    }

    #[test]
    fn pclntab_errors() {
        let bytes = sample(PclnFormat::Go118);
        let mut bad = bytes.clone();
        bad[0] = 0xfb;
        assert_eq!(
            Pclntab::parse(&bad).unwrap_err(),
            PclntabError::BadMagic(0xffff_fffb)
        );
        let mut bad = bytes.clone();
        bad[7] = 3;
        assert_eq!(Pclntab::parse(&bad).unwrap_err(), PclntabError::BadHeader);
        let mut bad = bytes.clone();
        bad[4] = 1;
        assert_eq!(Pclntab::parse(&bad).unwrap_err(), PclntabError::BadHeader);
        // nfunc far past the data.
        let mut bad = bytes.clone();
        bad[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Pclntab::parse(&bad).unwrap_err(), PclntabError::Truncated);
        // A _func record whose entry disagrees with the functab's.
        let table = Pclntab::parse(&bytes).unwrap();
        let record_of_read = bytes.len() - 3 * 16;
        let mut bad = bytes.clone();
        bad[record_of_read] ^= 1;
        let t = Pclntab::parse(&bad).unwrap();
        assert_eq!(t.find(FUNCTIONS).unwrap_err(), PclntabError::Inconsistent);
        assert!(table.find(FUNCTIONS).is_ok());
        // A truncated table fails cleanly, or finds what the whole one does
        // (the records' padding is not read).
        let whole = table.find(FUNCTIONS).unwrap();
        for len in 0..bytes.len() {
            if let Ok(t) = Pclntab::parse(&bytes[..len]) {
                if let Ok(found) = t.find(FUNCTIONS) {
                    assert!(found.iter().all(|s| whole.contains(s)), "{len}");
                }
            }
        }
    }

    /// Arbitrary bytes (a fixed pseudo-random sequence, and the sample with
    /// each byte flipped) never panic either parser.
    #[test]
    fn parsers_survive_garbage() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for format in [PclnFormat::Go118, PclnFormat::Go116] {
            let sample = sample(format);
            for i in 0..sample.len() {
                let mut b = sample.clone();
                b[i] = (next() & 0xff) as u8;
                if let Ok(t) = Pclntab::parse(&b) {
                    let _ = t.find(FUNCTIONS);
                }
            }
        }
        let blob = inline_blob(b"go1.19.8");
        for i in 0..blob.len() {
            let mut b = blob.clone();
            b[i] = (next() & 0xff) as u8;
            let _ = parse_build_info(&b, no_memory);
        }
        for _ in 0..2000 {
            let len = usize::try_from(next() % 200).unwrap();
            let mut b: Vec<u8> = (0..len).map(|_| (next() & 0xff) as u8).collect();
            if next() % 2 == 0 && b.len() >= 8 {
                b[..8].copy_from_slice(&[0xf1, 0xff, 0xff, 0xff, 0, 0, 1, 8]);
            }
            if let Ok(t) = Pclntab::parse(&b) {
                let _ = t.find(FUNCTIONS);
            }
            let _ = parse_build_info(&b, no_memory);
        }
    }
}
