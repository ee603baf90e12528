//! The `.entry` declarations of a PTX module, parsed from its text (PTX ISA, "Kernel Function
//! Parameters"): names and parameter lists. Pure text work, no CUDA; re-exported by
//! `warpline::module` ([`ptx_signatures`], [`PtxEntry`], [`PtxParam`], [`PtxParamKind`]).
//! It sits below `device` (whose `open` and `load_module` read the entries) so that `device`
//! imports nothing of `module` (issue 22, item 11).

use std::fmt;

use crate::error::{Error, Result};

// ---------------------------------------------------------------------------------------------
// PTX signatures
// ---------------------------------------------------------------------------------------------

/// The value class of a PTX parameter type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxParamKind {
    /// `.b8` .. `.b64`: untyped bits (any Rust value of the size fits).
    Bits,
    /// `.u8` .. `.u64`.
    Unsigned,
    /// `.s8` .. `.s64`.
    Signed,
    /// `.f16`, `.bf16`, `.f32`, `.f64`.
    Float,
    /// An array parameter (`.param .align A .b8 name[N]`: a struct or array passed by value).
    Aggregate,
}

/// One parameter of a PTX `.entry`, as declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxParam {
    /// The parameter's name in the PTX (`kernel_param_0`).
    pub name: String,
    /// Value class.
    pub kind: PtxParamKind,
    /// The element type as written (`.u64`, `.f32`, `.b8`).
    pub ty: String,
    /// Size in bytes (element size times array length).
    pub size: usize,
    /// `.align N` if given (bytes).
    pub align: Option<usize>,
    /// Declared with `.ptr` (a generic or state-space pointer, PTX ISA 5.7.x "Kernel function
    /// parameter attributes").
    pub pointer: bool,
}

impl fmt::Display for PtxParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == PtxParamKind::Aggregate {
            if let Some(a) = self.align {
                write!(f, ".align {a} ")?;
            }
            let elem = elem_size(&self.ty).unwrap_or(1);
            write!(f, "{} [{}]", self.ty, self.size / elem.max(1))
        } else {
            write!(f, "{}", self.ty)?;
            if self.pointer {
                write!(f, " .ptr")?;
            }
            Ok(())
        }
    }
}

/// One `.entry` of a PTX module: its name and its parameter list, or why the list could not be
/// read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxEntry {
    /// Entry (kernel) name.
    pub name: String,
    /// Parameters in order, or a description of the declaration that could not be parsed.
    pub params: std::result::Result<Vec<PtxParam>, String>,
}

impl PtxEntry {
    /// `name(.u64 .ptr, .u32)`, for error messages.
    pub fn describe(&self) -> String {
        match &self.params {
            Ok(p) => format!("{}({})", self.name, join(p.iter().map(|p| p.to_string()))),
            Err(e) => format!("{}(<unparsed: {e}>)", self.name),
        }
    }
}

pub(crate) fn join(it: impl Iterator<Item = String>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

/// Size in bytes of a PTX fundamental type (`.u32` -> 4); `None` for others.
fn elem_size(ty: &str) -> Option<usize> {
    Some(match ty {
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        _ => return None,
    })
}

fn kind_of(ty: &str) -> PtxParamKind {
    match ty.as_bytes().get(1) {
        Some(b'u') => PtxParamKind::Unsigned,
        Some(b's') => PtxParamKind::Signed,
        Some(b'f') => PtxParamKind::Float,
        _ if ty.starts_with(".bf") => PtxParamKind::Float,
        _ => PtxParamKind::Bits,
    }
}

/// `ptx` without `//` and `/* */` comments (quoted strings, as in `.file`, are kept verbatim).
fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut chars = ptx.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '"' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for d in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '%'
}

/// Parses one declaration `.param [.align N] .type [.ptr [.space] [.align N]] name[[N]]`.
fn parse_param(decl: &str) -> std::result::Result<PtxParam, String> {
    let mut toks = decl.split_whitespace().peekable();
    if toks.next() != Some(".param") {
        return Err(format!("`{decl}` is not a `.param` declaration"));
    }
    let (mut align, mut ty, mut pointer) = (None, None::<String>, false);
    let mut rest = String::new();
    while let Some(t) = toks.next() {
        match t {
            ".align" => {
                let n = toks
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| format!("`{decl}`: `.align` without a number"))?;
                // `.ptr .align N` is the pointee's alignment; only the first one before the type
                // describes the parameter itself.
                if ty.is_none() {
                    align = Some(n);
                }
            }
            ".ptr" => pointer = true,
            ".global" | ".shared" | ".const" | ".local" if pointer => {}
            t if t.starts_with('.') && ty.is_none() => {
                if elem_size(t).is_none() {
                    return Err(format!("`{decl}`: unsupported parameter type `{t}`"));
                }
                ty = Some(t.to_string());
            }
            t => {
                rest.push_str(t);
                rest.extend(toks.by_ref().map(|s| s.to_string()));
            }
        }
    }
    let ty = ty.ok_or_else(|| format!("`{decl}`: no parameter type"))?;
    let elem = elem_size(&ty).unwrap_or(0);
    let (name, count) = match rest.find('[') {
        None => (rest.clone(), None),
        Some(i) => {
            let inner = rest[i + 1..]
                .strip_suffix(']')
                .ok_or_else(|| format!("`{decl}`: unterminated array length"))?;
            let n = inner
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("`{decl}`: array length `{inner}` is not a number"))?;
            (rest[..i].to_string(), Some(n))
        }
    };
    if name.is_empty() || !name.chars().all(is_ident_char) {
        return Err(format!("`{decl}`: bad parameter name `{name}`"));
    }
    let size = elem
        .checked_mul(count.unwrap_or(1))
        .ok_or_else(|| format!("`{decl}`: the parameter's size overflows"))?;
    Ok(PtxParam {
        name,
        kind: if count.is_some() {
            PtxParamKind::Aggregate
        } else {
            kind_of(&ty)
        },
        size,
        ty,
        align,
        pointer,
    })
}

/// Every `.entry` of `ptx` with its parameter list (PTX ISA "Kernel and Function Directives":
/// `.entry name ( param-list ) body`; the parentheses may be left out when there are no
/// parameters). `.extern` declarations are skipped; comments are ignored. An entry whose
/// parameter list cannot be read is listed with the reason in [`PtxEntry::params`].
pub fn ptx_signatures(ptx: &str) -> Vec<PtxEntry> {
    let text = strip_comments(ptx);
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(rel) = text[from..].find(".entry") {
        let at = from + rel;
        from = at + ".entry".len();
        let before_ok = at == 0 || bytes[at - 1].is_ascii_whitespace();
        let after_ok = bytes.get(from).is_some_and(|b| b.is_ascii_whitespace());
        if !before_ok || !after_ok {
            continue;
        }
        // `.extern .entry` declares a kernel of another module: no body here.
        let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
        if text[line_start..at]
            .split_whitespace()
            .any(|t| t == ".extern")
        {
            continue;
        }
        let rest = text[from..].trim_start();
        let name: String = rest.chars().take_while(|&c| is_ident_char(c)).collect();
        if name.is_empty() {
            continue;
        }
        let after = rest[name.len()..].trim_start();
        let params = if let Some(list) = after.strip_prefix('(') {
            match list.find(')') {
                None => Err("unterminated parameter list".to_string()),
                Some(end) => list[..end]
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(parse_param)
                    .collect(),
            }
        } else {
            Ok(Vec::new())
        };
        out.push(PtxEntry { name, params });
    }
    out
}

/// [`Error::PtxNul`] if `ptx` holds a NUL byte (the driver takes it as a C string).
pub fn check_ptx_text(ptx: &str) -> Result<()> {
    match ptx.bytes().position(|b| b == 0) {
        Some(offset) => Err(Error::PtxNul { offset }),
        None => Ok(()),
    }
}
