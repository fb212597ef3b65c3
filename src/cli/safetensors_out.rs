//! One safetensors file written the way `synth` and `quantize` write theirs: every tensor's
//! place in the header first ([`Layout`]), then the data streamed in that order, so a 27B
//! checkpoint never has to fit in memory; into a temporary name renamed at the end, so an
//! interrupted or failed write leaves no file that looks whole.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The header being laid out: each tensor's dtype, shape and byte range, in writing order.
pub struct Layout {
    header: serde_json::Map<String, serde_json::Value>,
    at: usize,
}

impl Layout {
    /// `written_by` goes into `__metadata__` (the tool that made the file).
    pub fn new(written_by: &str) -> Layout {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt", "written_by": written_by}));
        Layout { header, at: 0 }
    }

    /// The next tensor: `bytes` of `dtype` (a safetensors name: BF16, F8_E4M3, …) of `shape`.
    pub fn place(&mut self, name: String, dtype: &str, shape: Vec<usize>, bytes: usize) {
        let at = self.at;
        self.header.insert(name, serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + bytes]}));
        self.at += bytes;
    }

    /// Starts the file at `path`: the header now, the data through [`Out::write`].
    pub fn create(self, path: &Path) -> anyhow::Result<Out> {
        let mut head = serde_json::to_vec(&serde_json::Value::Object(self.header))?;
        // The data starts 8-aligned (writers pad the header with spaces).
        head.resize(head.len().div_ceil(8) * 8, b' ');
        let tmp = path.with_file_name(format!(
            "{}.partial{}",
            path.file_name().map_or_else(|| "model.safetensors".into(), |n| n.to_string_lossy().to_string()),
            std::process::id()
        ));
        let file = File::create(&tmp).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", tmp.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&(head.len() as u64).to_le_bytes())?;
        w.write_all(&head)?;
        Ok(Out {
            w: Some(w),
            tmp,
            path: path.to_path_buf(),
            bytes: 8 + head.len() + self.at,
            data: self.at,
            written: 0,
        })
    }
}

/// A file being written; [`Out::finish`] checks that every byte the header promised came, syncs
/// it and gives it its name. Dropped unfinished, the partial file is removed.
pub struct Out {
    w: Option<BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
    bytes: usize,
    data: usize,
    written: usize,
}

impl Out {
    pub fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let Some(w) = self.w.as_mut() else { anyhow::bail!("{}: already finished", self.path.display()) };
        w.write_all(bytes).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", self.tmp.display()))?;
        self.written += bytes.len();
        Ok(())
    }

    /// The file's size in bytes.
    pub fn finish(mut self) -> anyhow::Result<usize> {
        anyhow::ensure!(
            self.written == self.data,
            "{}: {} bytes of tensor data written where the header places {}",
            self.path.display(),
            self.written,
            self.data
        );
        let Some(w) = self.w.take() else { anyhow::bail!("{}: already finished", self.path.display()) };
        w.into_inner().map_err(|e| anyhow::anyhow!("cannot write {}: {e}", self.tmp.display()))?.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| anyhow::anyhow!("cannot rename {} to {}: {e}", self.tmp.display(), self.path.display()))?;
        Ok(self.bytes)
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        if self.w.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_appears_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let layout = |n: usize| {
            let mut l = Layout::new("test");
            l.place("a".into(), "BF16", vec![2], 4);
            l.place("b".into(), "F8_E4M3", vec![n], n);
            l
        };
        // Written in full: a safetensors file the crate reads back, tensor by tensor.
        let mut out = layout(3).create(&path).unwrap();
        out.write(&[1, 0, 2, 0]).unwrap();
        out.write(&[7, 8, 9]).unwrap();
        let size = out.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), size);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("b").unwrap().data(), [7, 8, 9]);
        assert_eq!(st.tensor("a").unwrap().dtype(), safetensors::Dtype::BF16);

        // Short of what the header promised: an error, and neither name holds a file.
        let short = dir.path().join("short.safetensors");
        let mut out = layout(3).create(&short).unwrap();
        out.write(&[1, 0, 2, 0]).unwrap();
        let e = out.finish().unwrap_err().to_string();
        assert!(e.contains("4 bytes of tensor data written where the header places 7"), "{e}");
        // Dropped part way (an error in between): the partial file is gone.
        let mut out = layout(3).create(&short).unwrap();
        out.write(&[1]).unwrap();
        drop(out);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("model.safetensors")]);
    }
}
