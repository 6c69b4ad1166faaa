//! safetensors I/O: tensors named after the DSL parameters (and `out` for results).
//!
//! Supported element types: bf16, f16, f32, i32 (and bool, which foxc produces nowhere but
//! reads for completeness). Anything else is a user error naming the file and the tensor.

use crate::tensor::{HostTensor, TensorMap};
use foxc_ir::DType;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot read `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("cannot write `{path}`: {msg}")]
    Write { path: String, msg: String },
    #[error("`{path}` is not a valid safetensors file: {msg}")]
    Format { path: String, msg: String },
    #[error("`{path}`: tensor `{tensor}` has element type {dtype}, which foxc does not support (use bf16, f16, f32 or i32)")]
    Dtype { path: String, tensor: String, dtype: String },
    #[error("`{path}`: tensor `{tensor}`: {msg}")]
    Tensor { path: String, tensor: String, msg: String },
}

fn from_st(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::F32 => DType::F32,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn to_st(d: DType) -> Dtype {
    match d {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::F32 => Dtype::F32,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

/// Parse safetensors bytes; `path` only names the source in errors.
pub fn parse_safetensors(bytes: &[u8], path: &str) -> Result<TensorMap, IoError> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| IoError::Format { path: path.into(), msg: e.to_string() })?;
    let mut out = TensorMap::new();
    for (name, view) in st.tensors() {
        let dtype = from_st(view.dtype()).ok_or_else(|| IoError::Dtype {
            path: path.into(),
            tensor: name.clone(),
            dtype: format!("{:?}", view.dtype()),
        })?;
        let shape = view.shape().to_vec();
        let numel = shape.iter().try_fold(1usize, |a, &s| a.checked_mul(s));
        if numel.and_then(|n| n.checked_mul(dtype.size_bytes())) != Some(view.data().len()) {
            return Err(IoError::Tensor {
                path: path.into(),
                tensor: name,
                msg: format!(
                    "shape {shape:?} of {dtype} does not match its {} data bytes",
                    view.data().len()
                ),
            });
        }
        out.insert(name, HostTensor { dtype, shape, data: view.data().to_vec() });
    }
    Ok(out)
}

/// Read every tensor of a safetensors file.
pub fn read_safetensors(path: impl AsRef<Path>) -> Result<TensorMap, IoError> {
    let p = path.as_ref();
    let shown = p.display().to_string();
    let bytes = std::fs::read(p).map_err(|source| IoError::Read { path: shown.clone(), source })?;
    parse_safetensors(&bytes, &shown)
}

fn views<'a>(tensors: &'a TensorMap, path: &str) -> Result<Vec<(String, TensorView<'a>)>, IoError> {
    tensors
        .iter()
        .map(|(name, t)| {
            let expect = t.numel().checked_mul(t.dtype.size_bytes());
            if expect != Some(t.data.len()) {
                return Err(IoError::Tensor {
                    path: path.into(),
                    tensor: name.clone(),
                    msg: format!(
                        "shape {:?} of {} does not match its {} data bytes",
                        t.shape,
                        t.dtype,
                        t.data.len()
                    ),
                });
            }
            let v = TensorView::new(to_st(t.dtype), t.shape.clone(), &t.data).map_err(|e| {
                IoError::Tensor { path: path.into(), tensor: name.clone(), msg: e.to_string() }
            })?;
            Ok((name.clone(), v))
        })
        .collect()
}

/// Serialize tensors to safetensors bytes; `path` only names the destination in errors.
pub fn serialize_safetensors(tensors: &TensorMap, path: &str) -> Result<Vec<u8>, IoError> {
    safetensors::serialize(views(tensors, path)?, None)
        .map_err(|e| IoError::Write { path: path.into(), msg: e.to_string() })
}

/// Write tensors to a safetensors file (tensor names are the map keys).
pub fn write_safetensors(path: impl AsRef<Path>, tensors: &TensorMap) -> Result<(), IoError> {
    let p = path.as_ref();
    let shown = p.display().to_string();
    let bytes = serialize_safetensors(tensors, &shown)?;
    write_atomic(p, &bytes)
}

/// Write `bytes` to `path` so that readers see the old file or the whole new one, never a part:
/// a temporary file in the same directory (same file system, so the rename is atomic), synced,
/// then renamed over `path`. On any failure (a full disk, a cut write) the temporary file is
/// removed and an existing `path` is left as it was.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    use std::io::Write;
    let err = |e: std::io::Error| IoError::Write { path: path.display().to_string(), msg: e.to_string() };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // The mode `File::create` would leave: an existing file's, else 0o666 less the umask (the
    // temporary file's own 0o600 would hide the output from other users).
    #[cfg(unix)]
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions(),
        Err(_) => std::os::unix::fs::PermissionsExt::from_mode(0o666),
    };
    #[cfg(unix)]
    builder.permissions(mode);
    let mut tmp = builder.tempfile_in(dir).map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("foxc-io-{}-{name}", std::process::id()))
    }

    fn sample() -> TensorMap {
        let mut m = TensorMap::new();
        let vals: Vec<f32> = (0..24).map(|i| (i as f32 - 7.3) * 0.37).collect();
        for dt in [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64] {
            m.insert(format!("t_{dt}"), HostTensor::from_f32_as(dt, &[2, 3, 4], &vals));
        }
        m.insert("scalar".into(), HostTensor::from_f32(&[], &[1.5]));
        m
    }

    #[test]
    fn roundtrip_every_dtype() {
        let p = tmp("rt.safetensors");
        let m = sample();
        write_safetensors(&p, &m).unwrap();
        let back = read_safetensors(&p).unwrap();
        assert_eq!(back, m);
        assert_eq!(back["t_bf16"].dtype, DType::BF16);
        assert_eq!(back["t_i32"].to_f32_vec()[0], -2.0);
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn missing_file_names_the_path() {
        let e = read_safetensors("/nonexistent/dir/x.safetensors").unwrap_err().to_string();
        assert!(e.contains("/nonexistent/dir/x.safetensors"), "{e}");
    }

    #[test]
    fn garbage_is_a_format_error() {
        let e = parse_safetensors(b"not a safetensors file at all", "bad.st").unwrap_err().to_string();
        assert!(e.contains("`bad.st` is not a valid safetensors file"), "{e}");
        let e = parse_safetensors(&[], "empty.st").unwrap_err().to_string();
        assert!(e.contains("empty.st"), "{e}");
    }

    #[test]
    fn unsupported_dtype_names_file_and_tensor() {
        let data = vec![0u8; 16];
        let v = TensorView::new(Dtype::F64, vec![2], &data).unwrap();
        let bytes = safetensors::serialize([("weights", v)], None).unwrap();
        let e = parse_safetensors(&bytes, "in.safetensors").unwrap_err().to_string();
        assert!(e.contains("in.safetensors") && e.contains("`weights`") && e.contains("F64"), "{e}");
    }

    #[test]
    fn inconsistent_host_tensor_is_an_error() {
        let mut m = TensorMap::new();
        m.insert("q".into(), HostTensor { dtype: DType::F32, shape: vec![2, 2], data: vec![0; 8] });
        let e = serialize_safetensors(&m, "out.safetensors").unwrap_err().to_string();
        assert!(e.contains("out.safetensors") && e.contains("`q`"), "{e}");
    }
}
