//! Where a model's files come from: a Hugging Face directory on disk (weights memory-mapped), or
//! a set of files embedded in the binary (the demo model). Everything downstream reads through
//! this one interface, so an embedded model takes exactly the loader path of a real checkpoint.

use std::borrow::Cow;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

mod demo;
pub use demo::{DEMO, demo_source};

/// Files compiled into the binary: `(file name, bytes)`.
#[derive(Debug)]
pub struct EmbeddedModel {
    pub name: &'static str,
    pub files: &'static [(&'static str, &'static [u8])],
}

#[derive(Debug, Clone)]
pub enum ModelSource {
    Dir(PathBuf),
    Embedded(&'static EmbeddedModel),
}

/// The bytes of a weights file: memory-mapped from disk, or static.
pub enum FileBytes {
    Mmap(memmap2::Mmap),
    Static(&'static [u8]),
}

impl Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mmap(m) => m,
            FileBytes::Static(s) => s,
        }
    }
}

impl ModelSource {
    /// A human label for messages: the directory, or `embedded:<name>`.
    pub fn label(&self) -> String {
        match self {
            ModelSource::Dir(d) => d.display().to_string(),
            ModelSource::Embedded(e) => format!("embedded:{}", e.name),
        }
    }

    /// The label of one file of the model, for error messages.
    pub fn file_label(&self, name: &str) -> String {
        match self {
            ModelSource::Dir(d) => d.join(name).display().to_string(),
            ModelSource::Embedded(e) => format!("embedded:{}/{}", e.name, name),
        }
    }

    pub fn dir(&self) -> PathBuf {
        match self {
            ModelSource::Dir(d) => d.clone(),
            ModelSource::Embedded(e) => PathBuf::from(format!("embedded:{}", e.name)),
        }
    }

    pub fn exists(&self, name: &str) -> bool {
        match self {
            ModelSource::Dir(d) => d.join(name).is_file(),
            ModelSource::Embedded(e) => e.files.iter().any(|(n, _)| *n == name),
        }
    }

    /// Reads a whole (small) file; `Ok(None)` when it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<Cow<'static, [u8]>>> {
        match self {
            ModelSource::Dir(d) => {
                let p = d.join(name);
                match std::fs::read(&p) {
                    Ok(b) => Ok(Some(Cow::Owned(b))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::io(p, e)),
                }
            }
            ModelSource::Embedded(e) => Ok(e.files.iter().find(|(n, _)| *n == name).map(|(_, b)| Cow::Borrowed(*b))),
        }
    }

    /// Reads a small text file; `Ok(None)` when it does not exist.
    pub fn read_string(&self, name: &str) -> Result<Option<String>> {
        match self.read(name)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b.into_owned())
                .map(Some)
                .map_err(|_| Error::Json { file: self.file_label(name), message: "not valid UTF-8".into() }),
        }
    }

    /// Maps a (large) weights file without reading it.
    pub fn map(&self, name: &str) -> Result<FileBytes> {
        match self {
            ModelSource::Dir(d) => {
                let p = d.join(name);
                let f = File::open(&p).map_err(|e| Error::io(&p, e))?;
                // SAFETY: the file is opened read-only; like every mmap-based loader we assume
                // nobody truncates a checkpoint while it is being served.
                let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::io(&p, e))?;
                Ok(FileBytes::Mmap(m))
            }
            ModelSource::Embedded(e) => {
                e.files.iter().find(|(n, _)| *n == name).map(|(_, b)| FileBytes::Static(b)).ok_or_else(|| {
                    Error::MissingFile { dir: self.dir(), file: name.to_string(), hint: "not embedded".into() }
                })
            }
        }
    }

    /// Parses a JSON file; `Ok(None)` when it does not exist.
    pub fn read_json(&self, name: &str) -> Result<Option<serde_json::Value>> {
        match self.read(name)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::Json { file: self.file_label(name), message: e.to_string() }),
        }
    }
}

impl From<&Path> for ModelSource {
    fn from(p: &Path) -> Self {
        ModelSource::Dir(p.to_path_buf())
    }
}
