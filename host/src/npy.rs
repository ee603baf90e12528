//! `.npy` input and output of f32 arrays (NumPy format 1.0, 2.0 and 3.0; little-endian `<f4`,
//! C order).
//!
//! One parser reads every file (issue 19 item 12): the magic and version, the header length, and
//! the header dict, parsed as the Python literal it is (strings with escapes, integers, `True` /
//! `False` / `None`, tuples, lists and nested dicts, at most [`MAX_DEPTH`] deep). The dict must
//! hold exactly the keys `'descr'`, `'fortran_order'` and `'shape'`, each once; the shape's
//! product is computed with checked arithmetic, and the data after the header must be exactly
//! `product x 4` bytes. Nothing is allocated for the data before those checks, and no input
//! makes the reader panic.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

use crate::error::{Error, Result};

fn npy_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Npy {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Bytes of an f32 element.
const F32_BYTES: u64 = 4;

/// Longest header dict read or written, bytes (NumPy writes 128 bytes or so; its own reader
/// refuses headers above 10,000 bytes unless told otherwise).
pub const MAX_HEADER_BYTES: u64 = 1 << 16;

/// Deepest nesting of brackets in a header dict the parser follows.
pub const MAX_DEPTH: usize = 16;

/// The header of a float32 `.npy` file, checked: dtype `<f4`, C order, a shape whose product
/// fits u64 and whose data bytes are all in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// Dimensions (empty for a 0-d array, which holds 1 element).
    pub shape: Vec<u64>,
    /// The product of `shape` (0 if any dimension is 0).
    pub elements: u64,
    /// Bytes before the data: magic, version, header length and the header dict.
    pub data_offset: u64,
}

/// The product of `shape`: 0 if any dimension is 0, else the checked product (`None`: more
/// than `u64::MAX`).
pub fn shape_product(shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

// ------------------------------------------------------------------------------------------------
// The header dict: a Python literal
// ------------------------------------------------------------------------------------------------

/// A Python literal of a header dict.
#[derive(Clone, Debug, PartialEq)]
enum Lit {
    Str(String),
    /// An integer (the digits, sign included: checked where used).
    Int(String),
    Bool(bool),
    None,
    Tuple(Vec<Lit>),
    List(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

struct Parser<'s> {
    s: &'s [u8],
    at: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.at < self.s.len() && matches!(self.s[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.at).copied()
    }

    fn err<T>(&self, what: &str) -> std::result::Result<T, String> {
        Err(format!(
            "malformed .npy header dict at byte {}: {what}",
            self.at
        ))
    }

    fn expect(&mut self, c: u8) -> std::result::Result<(), String> {
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            self.err(&format!("expected '{}'", c as char))
        }
    }

    fn value(&mut self, depth: usize) -> std::result::Result<Lit, String> {
        if depth > MAX_DEPTH {
            return self.err(&format!("nested deeper than {MAX_DEPTH} levels"));
        }
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => self.string(q),
            Some(b'(') => {
                self.at += 1;
                let (items, comma) = self.items(b')', depth)?;
                // `(x)` is x in Python; `()`, `(x,)` and `(x, y)` are tuples.
                if items.len() == 1 && !comma {
                    Ok(items.into_iter().next().unwrap_or(Lit::None))
                } else {
                    Ok(Lit::Tuple(items))
                }
            }
            Some(b'[') => {
                self.at += 1;
                Ok(Lit::List(self.items(b']', depth)?.0))
            }
            Some(b'{') => {
                self.at += 1;
                self.dict(depth)
            }
            Some(c) if c == b'-' || c == b'+' || c.is_ascii_digit() => {
                let from = self.at;
                self.at += 1;
                while self.at < self.s.len() && self.s[self.at].is_ascii_digit() {
                    self.at += 1;
                }
                let digits = String::from_utf8_lossy(&self.s[from..self.at]).into_owned();
                // Python 2's long suffix.
                if self.at < self.s.len() && matches!(self.s[self.at], b'L' | b'l') {
                    self.at += 1;
                }
                if !digits.bytes().any(|b| b.is_ascii_digit()) {
                    return self.err("a sign without digits");
                }
                Ok(Lit::Int(digits))
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let from = self.at;
                while self.at < self.s.len() && self.s[self.at].is_ascii_alphanumeric() {
                    self.at += 1;
                }
                match &self.s[from..self.at] {
                    b"True" => Ok(Lit::Bool(true)),
                    b"False" => Ok(Lit::Bool(false)),
                    b"None" => Ok(Lit::None),
                    _ => {
                        self.at = from;
                        self.err("a name other than True, False or None")
                    }
                }
            }
            Some(_) => self.err("not the start of a value"),
            None => self.err("the header ends inside a value"),
        }
    }

    /// A quoted string with backslash escapes (the escaped character is kept as is; `\n` and
    /// friends only matter inside names, which are compared with plain ASCII).
    fn string(&mut self, quote: u8) -> std::result::Result<Lit, String> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            match self.s.get(self.at) {
                None => return self.err("unterminated string"),
                Some(b'\\') => {
                    let Some(&c) = self.s.get(self.at + 1) else {
                        return self.err("unterminated string");
                    };
                    out.push(c);
                    self.at += 2;
                }
                Some(&c) if c == quote => {
                    self.at += 1;
                    return Ok(Lit::Str(String::from_utf8_lossy(&out).into_owned()));
                }
                Some(&c) => {
                    out.push(c);
                    self.at += 1;
                }
            }
        }
    }

    /// Comma-separated values up to `close` (a trailing comma allowed); whether a comma was seen.
    fn items(&mut self, close: u8, depth: usize) -> std::result::Result<(Vec<Lit>, bool), String> {
        let mut items = Vec::new();
        let mut comma = false;
        loop {
            if self.peek() == Some(close) {
                self.at += 1;
                return Ok((items, comma));
            }
            items.push(self.value(depth + 1)?);
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    comma = true;
                }
                Some(c) if c == close => {}
                _ => return self.err(&format!("expected ',' or '{}'", close as char)),
            }
        }
    }

    fn dict(&mut self, depth: usize) -> std::result::Result<Lit, String> {
        let mut entries = Vec::new();
        loop {
            if self.peek() == Some(b'}') {
                self.at += 1;
                return Ok(Lit::Dict(entries));
            }
            let k = self.value(depth + 1)?;
            self.expect(b':')?;
            let v = self.value(depth + 1)?;
            entries.push((k, v));
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {}
                _ => return self.err("expected ',' or '}'"),
            }
        }
    }
}

/// Parses a header dict and returns `(descr, fortran_order, shape)`, each checked for its type.
fn parse_dict(text: &[u8]) -> std::result::Result<(String, bool, Vec<u64>), String> {
    let mut p = Parser { s: text, at: 0 };
    let dict = p.value(0)?;
    if p.peek().is_some() {
        return p.err("bytes after the dict (only spaces and a newline may follow it)");
    }
    let Lit::Dict(entries) = dict else {
        return Err("the .npy header is not a dict".into());
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (k, v) in entries {
        let Lit::Str(k) = k else {
            return Err(format!("header key {k:?} is not a string"));
        };
        let slot = match k.as_str() {
            "descr" => &mut descr,
            "fortran_order" => &mut fortran,
            "shape" => &mut shape,
            _ => {
                return Err(format!(
                    "unexpected header key '{k}'; allowed: 'descr', 'fortran_order', 'shape'"
                ))
            }
        };
        if slot.replace(v).is_some() {
            return Err(format!("header key '{k}' appears twice"));
        }
    }
    let (Some(descr), Some(fortran), Some(shape)) = (descr, fortran, shape) else {
        return Err(
            "the header dict must hold the keys 'descr', 'fortran_order' and 'shape'".into(),
        );
    };
    let descr = match descr {
        Lit::Str(d) => d,
        other => {
            return Err(format!(
                "expected dtype float32 ('<f4'), the file has a structured dtype {other:?}"
            ))
        }
    };
    let Lit::Bool(fortran) = fortran else {
        return Err(format!(
            "'fortran_order' must be True or False, not {fortran:?}"
        ));
    };
    let Lit::Tuple(dims) = shape else {
        return Err(format!(
            "'shape' must be a tuple of integers, not {shape:?}"
        ));
    };
    let shape =
        dims.iter()
            .map(|d| match d {
                Lit::Int(t) => t.trim_start_matches('+').parse::<u64>().map_err(|_| {
                    format!("shape dimension {t} is not an integer from 0 to 2^64 - 1")
                }),
                other => Err(format!("shape dimension {other:?} is not an integer")),
            })
            .collect::<std::result::Result<Vec<u64>, String>>()?;
    Ok((descr, fortran, shape))
}

// ------------------------------------------------------------------------------------------------
// Reading
// ------------------------------------------------------------------------------------------------

/// Reads `buf.len()` bytes or up to the end; returns how many were read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads and checks the header from `r`, positioned at the start of a file of `total_len` bytes.
fn header_from(r: &mut impl Read, total_len: u64) -> std::result::Result<NpyHeader, String> {
    let mut pre = [0u8; 10];
    let got = read_up_to(r, &mut pre).map_err(|e| e.to_string())?;
    if got < 10 || &pre[..6] != b"\x93NUMPY" {
        return Err(format!(
            "not a .npy file: it does not start with the magic \\x93NUMPY and a header ({got} bytes read)"
        ));
    }
    let (len, start) = match pre[6] {
        1 => (u64::from(u16::from_le_bytes([pre[8], pre[9]])), 10u64),
        2 | 3 => {
            let mut more = [0u8; 2];
            if read_up_to(r, &mut more).map_err(|e| e.to_string())? < 2 {
                return Err(format!(
                    "truncated .npy header: the file has {total_len} bytes"
                ));
            }
            let len = u32::from_le_bytes([pre[8], pre[9], more[0], more[1]]);
            (u64::from(len), 12)
        }
        v => {
            return Err(format!(
                "unsupported .npy format version {v}.{} (1.0, 2.0 and 3.0 are read)",
                pre[7]
            ))
        }
    };
    if len > MAX_HEADER_BYTES {
        return Err(format!(
            "the header dict declares {len} bytes; at most {MAX_HEADER_BYTES} are read"
        ));
    }
    let mut dict = vec![0u8; len as usize];
    let got = read_up_to(r, &mut dict).map_err(|e| e.to_string())?;
    if got < dict.len() {
        return Err(format!(
            "truncated .npy header: {len} bytes declared, {got} present"
        ));
    }
    let (descr, fortran, shape) = parse_dict(&dict)?;
    if descr != "<f4" {
        return Err(format!(
            "expected dtype float32 ('<f4'), the file has '{descr}'"
        ));
    }
    if fortran {
        return Err("Fortran-ordered arrays are not supported; save with order='C'".into());
    }
    let data_offset = start + len;
    let elements = shape_product(&shape).ok_or_else(|| {
        format!("declared shape {shape:?}: the product of its dimensions overflows u64 (the header is corrupt)")
    })?;
    let found = total_len.saturating_sub(data_offset);
    match elements.checked_mul(F32_BYTES) {
        None => Err(format!(
            "declared shape {shape:?} ({elements} elements) needs more than 2^64 bytes of float32 data; the file has {found} bytes after its header"
        )),
        Some(needed) if needed > found => Err(format!(
            "truncated or wrong shape: shape {shape:?} declares {elements} elements, i.e. {needed} bytes of float32 data, but the file has {found} bytes after its {data_offset}-byte header"
        )),
        Some(needed) if needed < found => Err(format!(
            "wrong shape or trailing bytes: shape {shape:?} declares {elements} elements, i.e. {needed} bytes of float32 data, but the file has {found} bytes after its {data_offset}-byte header"
        )),
        Some(_) => Ok(NpyHeader {
            shape,
            elements,
            data_offset,
        }),
    }
}

/// Reads a whole array from `r` (a file of `total_len` bytes).
fn array_from(
    r: &mut impl Read,
    total_len: u64,
) -> std::result::Result<(Vec<u64>, Vec<f32>), String> {
    let h = header_from(r, total_len)?;
    // elements x 4 bytes are in the file (checked), so this allocation is bounded by its size.
    let n = usize::try_from(h.elements)
        .map_err(|_| format!("{} elements do not fit this machine's memory", h.elements))?;
    let mut data = vec![0f32; n];
    r.read_exact(bytemuck::cast_slice_mut(&mut data))
        .map_err(|e| format!("reading the float32 data: {e}"))?;
    for x in &mut data {
        *x = f32::from_bits(u32::from_le(x.to_bits()));
    }
    Ok((h.shape, data))
}

/// Reads and checks the header of a float32 `.npy` file without reading its data: for callers
/// that check sizes (memory) before reading.
///
/// Errors: as [`read_f32`].
pub fn read_header(path: &Path) -> Result<NpyHeader> {
    let mut file = File::open(path).map_err(|e| npy_err(path, e))?;
    let len = file.metadata().map_err(|e| npy_err(path, e))?.len();
    header_from(&mut file, len).map_err(|e| npy_err(path, e))
}

/// Reads an f32 array (little-endian `<f4`, C order) and returns its shape and elements.
///
/// Errors ([`Error::Npy`], each saying what is wrong): a missing file, a malformed header (not
/// a dict, a key missing, repeated or unknown, a shape that is not a tuple of integers from 0 to
/// 2^64 - 1), a shape whose element count overflows, another dtype, Fortran order, and a file
/// whose data is not exactly the bytes its shape declares (truncated, wrong shape or trailing
/// bytes: the message gives the bytes expected and found). The checks come before any
/// allocation for the data, so a header that declares a huge shape cannot make the reader
/// allocate for it; no input makes it panic.
pub fn read_f32(path: &Path) -> Result<(Vec<u64>, Vec<f32>)> {
    let file = File::open(path).map_err(|e| npy_err(path, e))?;
    let len = file.metadata().map_err(|e| npy_err(path, e))?.len();
    array_from(&mut BufReader::new(file), len).map_err(|e| npy_err(path, e))
}

/// Reads a 1-D f32 array. Errors as [`read_f32`], plus a shape that is not 1-D.
pub fn read_f32_1d(path: &Path) -> Result<Vec<f32>> {
    let (shape, data) = read_f32(path)?;
    if shape.len() != 1 {
        return Err(npy_err(
            path,
            format!("expected a 1-D array, found shape {shape:?}"),
        ));
    }
    Ok(data)
}

// ------------------------------------------------------------------------------------------------
// Writing
// ------------------------------------------------------------------------------------------------

/// The bytes of a float32 `.npy` file of `shape` and `data` (format 1.0, or 2.0 for headers
/// above 65,535 bytes; the header padded so the data starts at a multiple of 64 bytes).
fn encode(shape: &[u64], data: &[f32]) -> std::result::Result<Vec<u8>, String> {
    let expected = shape_product(shape)
        .ok_or_else(|| format!("shape {shape:?}: the product of its dimensions overflows u64"))?;
    if expected != data.len() as u64 {
        return Err(format!(
            "shape {shape:?} holds {expected} elements, data has {}",
            data.len()
        ));
    }
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}");
    let v1 = 10 + dict.len() < 65_536 - 64;
    let pre = if v1 { 10 } else { 12 };
    while !(pre + dict.len() + 1).is_multiple_of(64) {
        dict.push(' ');
    }
    dict.push('\n');
    if dict.len() as u64 > MAX_HEADER_BYTES {
        return Err(format!(
            "shape {shape:?} needs a {}-byte header; at most {MAX_HEADER_BYTES} bytes are read back",
            dict.len()
        ));
    }
    let mut out = Vec::with_capacity(pre + dict.len() + 4 * data.len());
    out.extend(b"\x93NUMPY");
    if v1 {
        out.extend([1, 0]);
        out.extend((dict.len() as u16).to_le_bytes());
    } else {
        out.extend([2, 0]);
        out.extend((dict.len() as u32).to_le_bytes());
    }
    out.extend(dict.as_bytes());
    for x in data {
        out.extend(x.to_le_bytes());
    }
    Ok(out)
}

/// Writes `data` with `shape` as a float32 `.npy` file (C order, little-endian), which
/// [`read_f32`] reads back exactly.
///
/// Errors ([`Error::Npy`]): a shape whose product overflows u64 or differs from `data.len()`,
/// a shape too long for the header limit ([`MAX_HEADER_BYTES`]), file system errors. Nothing is
/// created unless the shape is valid.
pub fn write_f32(path: &Path, shape: &[u64], data: &[f32]) -> Result<()> {
    let bytes = encode(shape, data).map_err(|e| npy_err(path, e))?;
    let mut file = File::create(path).map_err(|e| npy_err(path, e))?;
    file.write_all(&bytes).map_err(|e| npy_err(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_shape_errors() {
        let dir = std::env::temp_dir().join(format!("warpline-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.npy");
        let data: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        write_f32(&p, &[37], &data).unwrap();
        assert_eq!(read_f32_1d(&p).unwrap(), data);
        write_f32(&p, &[1, 37], &data).unwrap();
        assert!(matches!(read_f32_1d(&p), Err(Error::Npy { .. })));
        assert!(matches!(
            write_f32(&p, &[36], &data),
            Err(Error::Npy { .. })
        ));
        assert!(matches!(
            read_f32_1d(&dir.join("missing.npy")),
            Err(Error::Npy { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod finding_17 {
    //! Finding 17 (issue 9): .npy errors say what is really wrong.
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("warpline-npy17-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A version 1.0 .npy file with `descr` and `shape` (the tuple's text), then `data` bytes.
    fn write_raw(path: &Path, descr: &str, shape: &str, data: &[u8]) {
        let mut dict =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}");
        while !(10 + dict.len() + 1).is_multiple_of(64) {
            dict.push(' ');
        }
        dict.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend((dict.len() as u16).to_le_bytes());
        bytes.extend(dict.as_bytes());
        bytes.extend(data);
        std::fs::write(path, bytes).unwrap();
    }

    fn detail(r: Result<(Vec<u64>, Vec<f32>)>) -> String {
        match r {
            Err(Error::Npy { detail, .. }) => detail,
            Err(e) => panic!("expected Error::Npy, got {e}"),
            Ok((s, _)) => panic!("expected an error, read shape {s:?}"),
        }
    }

    #[test]
    fn finding_17_truncated_npy_names_bytes_expected_and_found_not_the_dtype() {
        let d = dir("trunc");
        let p = d.join("t.npy");
        let data: Vec<f32> = (0..100).map(|i| i as f32).collect();
        write_f32(&p, &[100], &data).unwrap();
        let full = std::fs::metadata(&p).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(full - 10).unwrap();
        let msg = detail(read_f32(&p));
        assert!(msg.contains("truncated"), "{msg}");
        assert!(msg.contains("400 bytes"), "{msg}");
        assert!(msg.contains("390 bytes"), "{msg}");
        assert!(!msg.contains("dtype"), "{msg}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn finding_17_huge_declared_shape_is_rejected_by_size_before_allocating() {
        let d = dir("huge");
        let p = d.join("h.npy");
        // 10^12 elements declared, 16 bytes present: must fail fast, not allocate 4 TB.
        write_raw(&p, "<f4", "1000000000000,", &[0u8; 16]);
        let msg = detail(read_f32(&p));
        assert!(msg.contains("4000000000000 bytes"), "{msg}");
        assert!(msg.contains("16 bytes"), "{msg}");
        assert!(!msg.contains("dtype"), "{msg}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn finding_17_shape_whose_product_overflows_is_reported_as_such() {
        let d = dir("ovf");
        let p = d.join("o.npy");
        write_raw(&p, "<f4", "4294967296, 4294967296, 16", &[0u8; 16]);
        let msg = detail(read_f32(&p));
        assert!(msg.contains("overflows"), "{msg}");
        assert!(!msg.contains("dtype"), "{msg}");
        // Fits u64 as elements but not as bytes.
        write_raw(&p, "<f4", "4611686018427387905,", &[0u8; 16]);
        let msg = detail(read_f32(&p));
        assert!(msg.contains("2^64 bytes"), "{msg}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn finding_17_wrong_dtype_is_still_reported_as_the_dtype() {
        let d = dir("dtype");
        let p = d.join("d.npy");
        write_raw(&p, "<f8", "2,", &[0u8; 16]);
        let msg = detail(read_f32(&p));
        assert!(msg.contains("expected dtype float32"), "{msg}");
        assert!(msg.contains("<f8"), "{msg}");
        // A well-formed file still reads.
        write_raw(&p, "<f4", "2, 2", &[0u8; 16]);
        let (shape, data) = read_f32(&p).unwrap();
        assert_eq!((shape, data), (vec![2, 2], vec![0.0; 4]));
        std::fs::write(&p, b"not numpy").unwrap();
        assert!(detail(read_f32(&p)).contains("not a .npy file"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[cfg(test)]
mod issue19_item12 {
    //! Issue 19 item 12: one parser for the whole header; hostile headers give typed errors,
    //! never panics; write_f32 refuses shapes whose product overflows.
    use super::*;
    use proptest::prelude::*;

    /// A version 1.0 file with header dict `dict` (padded) and `data` bytes.
    fn with_dict(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut dict = dict.to_string();
        while !(10 + dict.len() + 1).is_multiple_of(64) {
            dict.push(' ');
        }
        dict.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend((dict.len() as u16).to_le_bytes());
        bytes.extend(dict.as_bytes());
        bytes.extend(data);
        bytes
    }

    fn decode(bytes: &[u8]) -> std::result::Result<(Vec<u64>, Vec<f32>), String> {
        array_from(&mut &bytes[..], bytes.len() as u64)
    }

    #[test]
    fn issue19_item12_duplicated_or_decoy_shape_keys_are_refused_not_overflowed() {
        // Duplicated key: the first passes any pre-check, the second overflows.
        let f = with_dict(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (4294967296, 4294967296, 16), }",
            &[0u8; 8],
        );
        let e = decode(&f).unwrap_err();
        assert!(e.contains("'shape' appears twice"), "{e}");
        // A decoy inside a string (here a key), the real shape overflowing.
        let f = with_dict(
            "{\"'shape': (2,)\": 0, 'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
            &[0u8; 8],
        );
        let e = decode(&f).unwrap_err();
        assert!(e.contains("unexpected header key"), "{e}");
        // The same decoy inside the descr string: the dtype is refused as such.
        let f = with_dict(
            "{'descr': \"<f4', 'shape': (2,)\", 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
            &[0u8; 8],
        );
        let e = decode(&f).unwrap_err();
        assert!(e.contains("expected dtype float32"), "{e}");
        // Only the real shape counts: its overflow is reported.
        let f = with_dict(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }",
            &[0u8; 8],
        );
        assert!(decode(&f).unwrap_err().contains("overflows u64"));
        // A zero dimension makes the product 0, whatever the others are.
        let f = with_dict(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0), }",
            &[],
        );
        assert_eq!(decode(&f).unwrap(), (vec![1 << 32, 1 << 32, 0], vec![]));
        // Trailing bytes after the data are refused too (the data length must match).
        let f = with_dict(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
            &[0u8; 8],
        );
        assert!(decode(&f).unwrap_err().contains("trailing bytes"));
        // Negative, non-integer and too-large dimensions, deep nesting, missing keys.
        for (shape, want) in [
            ("(-1,)", "not an integer from 0"),
            ("(18446744073709551616,)", "not an integer from 0"),
            ("(2.5,)", "expected ','"),
            ("[2]", "must be a tuple"),
            ("(2)", "must be a tuple"),
        ] {
            let f = with_dict(
                &format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"),
                &[0u8; 8],
            );
            let e = decode(&f).unwrap_err();
            assert!(e.contains(want), "{shape}: {e}");
        }
        let deep = format!("{{'x': {}{}}}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(decode(&with_dict(&deep, &[]))
            .unwrap_err()
            .contains("nested deeper"));
        let f = with_dict("{'descr': '<f4', 'shape': (1,), }", &[0u8; 4]);
        assert!(decode(&f).unwrap_err().contains("must hold the keys"));
    }

    #[test]
    fn issue19_item12_evil_npy_files_through_read_f32_and_read_header() {
        let d = std::env::temp_dir().join(format!("warpline-npy19-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("evil.npy");
        std::fs::write(
            &p,
            with_dict(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (4294967296, 4294967296, 16), }",
                &[0u8; 8],
            ),
        )
        .unwrap();
        assert!(matches!(read_f32(&p), Err(Error::Npy { .. })));
        assert!(matches!(read_header(&p), Err(Error::Npy { .. })));
        write_f32(&p, &[3, 5], &[1.5; 15]).unwrap();
        let h = read_header(&p).unwrap();
        assert_eq!((h.shape.as_slice(), h.elements), (&[3u64, 5][..], 15));
        assert_eq!(h.data_offset % 64, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn issue19_item12_write_f32_refuses_a_shape_whose_product_overflows() {
        let d = std::env::temp_dir().join(format!("warpline-npy19w-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("w.npy");
        // [2^32, 2^32] wraps to 0 elements, which equalled the empty data.
        let r = write_f32(&p, &[1 << 32, 1 << 32], &[]);
        assert!(matches!(&r, Err(Error::Npy { detail, .. }) if detail.contains("overflows")));
        assert!(!p.exists(), "nothing is created for a refused shape");
        assert!(write_f32(&p, &[1 << 32, 1 << 32, 0], &[]).is_ok());
        assert_eq!(read_f32(&p).unwrap().0, vec![1 << 32, 1 << 32, 0]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Shapes of up to 4 dimensions holding at most a few thousand elements.
    fn small_array() -> impl Strategy<Value = (Vec<u64>, Vec<f32>)> {
        prop::collection::vec(0u64..12, 0..4).prop_flat_map(|shape| {
            let n = shape_product(&shape).unwrap() as usize;
            (
                Just(shape),
                prop::collection::vec(any::<u32>().prop_map(f32::from_bits), n),
            )
        })
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn issue19_item12_round_trip_of_random_arrays((shape, data) in small_array()) {
            let bytes = encode(&shape, &data).unwrap();
            let (s, d) = decode(&bytes).unwrap();
            prop_assert_eq!(&s, &shape);
            prop_assert_eq!(bits(&d), bits(&data));
            // npyz (an independent implementation) reads what we write, for non-0-d shapes.
            if !shape.is_empty() {
                let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
                prop_assert_eq!(npy.shape(), &shape[..]);
                prop_assert_eq!(bits(&npy.into_vec::<f32>().unwrap()), bits(&data));
            }
        }

        #[test]
        fn issue19_item12_npyz_files_read_back(shape in prop::collection::vec(1u64..9, 1..4), seed in any::<u32>()) {
            let n = shape_product(&shape).unwrap() as usize;
            let data: Vec<f32> = (0..n).map(|i| (i as f32) * 0.25 - seed as f32).collect();
            let mut buf = Vec::new();
            {
                use npyz::WriterBuilder;
                let mut w = npyz::WriteOptions::<f32>::new()
                    .default_dtype()
                    .shape(&shape)
                    .writer(&mut buf)
                    .begin_nd()
                    .unwrap();
                w.extend(data.iter().copied()).unwrap();
                w.finish().unwrap();
            }
            let (s, d) = decode(&buf).unwrap();
            prop_assert_eq!(s, shape);
            prop_assert_eq!(bits(&d), bits(&data));
        }

        #[test]
        fn issue19_item12_mutated_files_never_panic(
            (shape, data) in small_array(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
            truncate in any::<bool>(),
        ) {
            let mut bytes = encode(&shape, &data).unwrap();
            for (at, b) in edits {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len() + 1));
            }
            // Either an error or an array whose data fills exactly the rest of the file.
            if let Ok((s, d)) = decode(&bytes) {
                prop_assert_eq!(shape_product(&s), Some(d.len() as u64));
            }
        }

        #[test]
        fn issue19_item12_hostile_header_dicts_never_panic(
            parts in prop::collection::vec(
                prop_oneof![
                    Just("'shape'".to_string()), Just("'descr'".to_string()),
                    Just("'fortran_order'".to_string()), Just("'<f4'".to_string()),
                    Just(":".to_string()), Just(",".to_string()), Just("(".to_string()),
                    Just(")".to_string()), Just("{".to_string()), Just("}".to_string()),
                    Just("[".to_string()), Just("]".to_string()), Just("False".to_string()),
                    Just("True".to_string()), Just("'".to_string()), Just("\\".to_string()),
                    Just("-".to_string()), any::<u64>().prop_map(|v| v.to_string()),
                    "[ -~]{0,6}",
                ],
                0..40,
            ),
            data_len in 0usize..64,
        ) {
            let f = with_dict(&parts.concat(), &vec![0u8; data_len]);
            if let Ok((s, d)) = decode(&f) {
                prop_assert_eq!(shape_product(&s), Some(d.len() as u64));
            }
        }

        #[test]
        fn issue19_item12_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let mut f = b"\x93NUMPY".to_vec();
            f.extend(bytes);
            let _ = decode(&f);
        }
    }
}
