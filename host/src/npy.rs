//! `.npy` input and output of f32 arrays (NumPy format, through the `npyz` crate).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use npyz::WriterBuilder;

use crate::error::{Error, Result};

fn npy_err(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Npy {
        path: path.display().to_string(),
        detail: detail.to_string(),
    }
}

/// Reads an f32 array (little-endian `<f4`, C order) and returns its shape and elements.
/// Errors: [`Error::Npy`] for a missing file, another dtype, Fortran order or a truncated file.
pub fn read_f32(path: &Path) -> Result<(Vec<u64>, Vec<f32>)> {
    let file = File::open(path).map_err(|e| npy_err(path, e))?;
    let npy = npyz::NpyFile::new(BufReader::new(file)).map_err(|e| npy_err(path, e))?;
    if npy.order() != npyz::Order::C {
        return Err(npy_err(
            path,
            "Fortran-ordered arrays are not supported; save with order='C'",
        ));
    }
    let shape = npy.shape().to_vec();
    let dtype = npy.dtype();
    let data = npy.into_vec::<f32>().map_err(|e| {
        npy_err(
            path,
            format!("expected dtype float32 ('<f4'), file has {dtype:?}: {e}"),
        )
    })?;
    Ok((shape, data))
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
