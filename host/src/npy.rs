//! `.npy` input and output of f32 arrays (NumPy format, through the `npyz` crate).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use npyz::WriterBuilder;

use crate::error::{Error, Result};

fn npy_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Npy {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Bytes of an f32 element.
const F32_BYTES: u64 = 4;

/// The header of a `.npy` file as far as sizes go: the byte offset of the data and the declared
/// shape (NumPy format 1.0/2.0/3.0: magic `\x93NUMPY`, version, a little-endian u16 (1.x) or u32
/// (2.x, 3.x) header length, then the header dict). `shape` is `None` where the dict has no
/// plain tuple of integers (npyz then reports what is wrong with it).
struct RawHeader {
    data_offset: u64,
    shape: Option<Vec<u64>>,
}

fn raw_header(path: &Path, file: &mut File) -> Result<RawHeader> {
    let mut pre = [0u8; 12];
    let mut got = 0;
    while got < pre.len() {
        match file.read(&mut pre[got..]).map_err(|e| npy_err(path, e))? {
            0 => break,
            n => got += n,
        }
    }
    if got < 10 || &pre[..6] != b"\x93NUMPY" {
        return Err(npy_err(
            path,
            format!("not a .npy file: it does not start with the magic \\x93NUMPY and a header ({got} bytes read)"),
        ));
    }
    let (len, start) = match pre[6] {
        1 => (u16::from_le_bytes([pre[8], pre[9]]) as u64, 10),
        2 | 3 if got == 12 => (
            u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]) as u64,
            12,
        ),
        2 | 3 => {
            return Err(npy_err(
                path,
                format!("truncated .npy header: the file has {got} bytes"),
            ))
        }
        v => {
            return Err(npy_err(
                path,
                format!(
                    "unsupported .npy format version {v}.{} (1.0, 2.0 and 3.0 are read)",
                    pre[7]
                ),
            ))
        }
    };
    // The header dict is short (NumPy pads it to a multiple of 64 bytes); read at most 64 KiB.
    let mut dict = vec![0u8; len.min(1 << 16) as usize];
    let already = (got - start).min(dict.len());
    dict[..already].copy_from_slice(&pre[start..start + already]);
    file.read_exact(&mut dict[already..]).map_err(|e| {
        npy_err(
            path,
            format!("truncated .npy header ({len} bytes declared): {e}"),
        )
    })?;
    Ok(RawHeader {
        data_offset: start as u64 + len,
        shape: parse_shape(&String::from_utf8_lossy(&dict)),
    })
}

/// The `'shape': (d0, d1, ...)` tuple of a header dict, if it is a plain tuple of integers.
fn parse_shape(dict: &str) -> Option<Vec<u64>> {
    let at = dict.find("'shape'").or_else(|| dict.find("\"shape\""))?;
    let rest = &dict[at..];
    let open = rest.find('(')?;
    let close = rest[open..].find(')')? + open;
    rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('L').parse::<u64>().ok())
        .collect()
}

/// Reads an f32 array (little-endian `<f4`, C order) and returns its shape and elements.
///
/// Errors ([`Error::Npy`], each saying what is wrong): a missing file, a malformed header, a
/// shape whose element count overflows, another dtype, Fortran order, and a file holding fewer
/// data bytes than its shape declares (a truncated file or a wrong shape: the message gives the
/// bytes expected and found). The size checks come before any allocation, so a header that
/// declares a huge shape cannot make the reader allocate for it.
pub fn read_f32(path: &Path) -> Result<(Vec<u64>, Vec<f32>)> {
    let mut file = File::open(path).map_err(|e| npy_err(path, e))?;
    let file_len = file.metadata().map_err(|e| npy_err(path, e))?.len();
    let raw = raw_header(path, &mut file)?;
    // Checked here, before npyz computes the product of the shape (which overflows silently or
    // panics).
    if let Some(shape) = &raw.shape {
        element_count(path, shape)?;
    }
    let file = File::open(path).map_err(|e| npy_err(path, e))?;
    let npy = npyz::NpyFile::new(BufReader::new(file))
        .map_err(|e| npy_err(path, format!("malformed .npy header: {e}")))?;
    let dtype = npy.dtype();
    let is_f32 = matches!(&dtype, npyz::DType::Plain(t) if t.to_string() == "<f4");
    if !is_f32 {
        return Err(npy_err(
            path,
            format!(
                "expected dtype float32 ('<f4'), the file has {}",
                dtype.descr()
            ),
        ));
    }
    if npy.order() != npyz::Order::C {
        return Err(npy_err(
            path,
            "Fortran-ordered arrays are not supported; save with order='C'",
        ));
    }
    let shape = npy.shape().to_vec();
    // Before reading (npyz reserves the declared element count up front).
    let elements = element_count(path, &shape)?;
    check_data_size(path, &shape, elements, file_len, raw.data_offset)?;
    let data = npy
        .into_vec::<f32>()
        .map_err(|e| npy_err(path, format!("reading the float32 data: {e}")))?;
    Ok((shape, data))
}

/// The product of `shape`, or an error saying that it overflows.
fn element_count(path: &Path, shape: &[u64]) -> Result<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            npy_err(
                path,
                format!("declared shape {shape:?}: the product of its dimensions overflows u64 (the header is corrupt)"),
            )
        })
}

/// A file must hold `elements x 4` bytes after its header.
fn check_data_size(
    path: &Path,
    shape: &[u64],
    elements: u64,
    file_len: u64,
    data_offset: u64,
) -> Result<()> {
    let found = file_len.saturating_sub(data_offset);
    let needed = elements.checked_mul(F32_BYTES);
    match needed {
        Some(needed) if needed <= found => Ok(()),
        Some(needed) => Err(npy_err(
            path,
            format!(
                "truncated or wrong shape: shape {shape:?} declares {elements} elements, i.e. {needed} bytes of float32 data, but the file has {found} bytes after its {data_offset}-byte header"
            ),
        )),
        None => Err(npy_err(
            path,
            format!(
                "declared shape {shape:?} ({elements} elements) needs more than 2^64 bytes of float32 data; the file has {found} bytes after its header"
            ),
        )),
    }
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

/// Writes `data` with `shape` as a float32 `.npy` file.
pub fn write_f32(path: &Path, shape: &[u64], data: &[f32]) -> Result<()> {
    let expected: u64 = shape.iter().product();
    if expected != data.len() as u64 {
        return Err(npy_err(
            path,
            format!(
                "shape {shape:?} holds {expected} elements, data has {}",
                data.len()
            ),
        ));
    }
    let file = File::create(path).map_err(|e| npy_err(path, e))?;
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(shape)
        .writer(std::io::BufWriter::new(file))
        .begin_nd()
        .map_err(|e| npy_err(path, e))?;
    w.extend(data.iter().copied())
        .map_err(|e| npy_err(path, e))?;
    w.finish().map_err(|e| npy_err(path, e))
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
        while (10 + dict.len() + 1) % 64 != 0 {
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
