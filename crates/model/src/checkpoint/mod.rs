//! Where a model's files come from: a Hugging Face directory on disk (weights memory-mapped), or
//! a set of files embedded in the binary (the demo model). Everything downstream reads through
//! this one interface, so an embedded model takes exactly the loader path of a real checkpoint.
//!
//! Unsafe code is denied here but for two functions, each allowing it for one call with its
//! `SAFETY:` comment: [`ModelSource::map`] (mapping a weights file) and [`FileBytes::release`]
//! (`MADV_DONTNEED` on that mapping). Everything else in the crate's unsafe code is in `model/`.

#![deny(unsafe_code)]

use std::borrow::Cow;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};

mod demo;
pub use demo::demo_source;

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
    /// A GGUF file or split set (`model::gguf::open_source` makes it): its tensors are read from
    /// the parts, its small files (config.json, tokenizer.json…) are synthesised from the
    /// metadata, so every reader downstream takes the path of a Hugging Face directory.
    Gguf(Arc<GgufSource>),
}

/// A GGUF model as a source of files: the parts on disk, and the Hugging Face files its
/// metadata stands for.
#[derive(Debug)]
pub struct GgufSource {
    /// The directory holding the parts.
    pub dir: PathBuf,
    /// The part file names, in order (one for a single file).
    pub parts: Vec<String>,
    /// Files synthesised from the metadata: `(name, bytes)`.
    pub files: Vec<(String, Vec<u8>)>,
    /// llama.cpp's name for the file type ("Q4_K_M"), when the metadata says.
    pub file_type: Option<String>,
    /// What a user must know about the file (one line each): GDN state inputs quantised
    /// below 8 bits, an MTP head it does not carry.
    pub notes: Vec<String>,
    /// `general.architecture` (`qwen35`…).
    pub architecture: String,
    /// Bytes and values of every tensor in the parts (what llama.cpp reports as a model's
    /// `size` and `n_params`).
    pub tensor_bytes: u64,
    pub tensor_values: u64,
}

impl GgufSource {
    /// The first part's path (the file the user named, for a single file).
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.parts.first().map(String::as_str).unwrap_or_default())
    }

    fn file(&self, name: &str) -> Option<&[u8]> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, b)| b.as_slice())
    }
}

/// The bytes of a weights file: memory-mapped from disk, or static.
pub enum FileBytes {
    Mmap(memmap2::Mmap),
    Static(&'static [u8]),
}

impl FileBytes {
    /// Tells the kernel this process is done with `start..start + len` of a mapped file: the
    /// pages leave the process's resident set (they stay in the page cache, and are read again
    /// if touched). A tensor copied out at load (widened, rounded, or misaligned in the file)
    /// has its pages released, so the resident set holds it once, not also the file's copy.
    #[allow(unsafe_code)]
    pub fn release(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if let FileBytes::Mmap(m) = self {
            // SAFETY: the mapping is a read-only shared mapping of a file nobody writes (see
            // `map`); MADV_DONTNEED on it only drops pages, which a later read faults back in
            // from the same file, so no reference into it ever sees other bytes.
            let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
        }
        #[cfg(not(unix))]
        let _ = (start, len);
    }

    /// Asks the kernel to read the whole mapped file ahead (MADV_WILLNEED): asynchronous, and
    /// nearly free when the file is in the page cache already. (MADV_HUGEPAGE as well was
    /// measured: the file then maps with 2 MiB pages, but decode was no faster on this machine
    /// and a cold start's prefill slower, so it is not asked for.)
    pub fn will_need(&self) {
        #[cfg(unix)]
        if let FileBytes::Mmap(m) = self {
            let _ = m.advise(memmap2::Advice::WillNeed);
        }
    }
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
    /// What a user must know about the model's files, one line each (a GGUF's notes).
    pub fn notes(&self) -> &[String] {
        match self {
            ModelSource::Gguf(g) => &g.notes,
            _ => &[],
        }
    }

    /// A human label for messages: the directory, or `embedded:<name>`.
    pub fn label(&self) -> String {
        match self {
            ModelSource::Dir(d) => d.display().to_string(),
            ModelSource::Embedded(e) => format!("embedded:{}", e.name),
            ModelSource::Gguf(g) => g.path().display().to_string(),
        }
    }

    /// The label of one file of the model, for error messages.
    pub fn file_label(&self, name: &str) -> String {
        match self {
            ModelSource::Dir(d) => d.join(name).display().to_string(),
            ModelSource::Embedded(e) => format!("embedded:{}/{}", e.name, name),
            ModelSource::Gguf(g) if g.parts.iter().any(|p| p == name) => g.dir.join(name).display().to_string(),
            // A synthesised file: say which metadata it stands for.
            ModelSource::Gguf(g) => format!("{} (its metadata as {name})", g.path().display()),
        }
    }

    pub fn dir(&self) -> PathBuf {
        match self {
            ModelSource::Dir(d) => d.clone(),
            ModelSource::Embedded(e) => PathBuf::from(format!("embedded:{}", e.name)),
            ModelSource::Gguf(g) => g.dir.clone(),
        }
    }

    pub fn exists(&self, name: &str) -> bool {
        match self {
            ModelSource::Dir(d) => d.join(name).is_file(),
            ModelSource::Embedded(e) => e.files.iter().any(|(n, _)| *n == name),
            ModelSource::Gguf(g) => g.file(name).is_some() || g.parts.iter().any(|p| p == name),
        }
    }

    /// Whether anything is at `name` — a file, or something that should have been one (a
    /// dangling link, a FIFO…, which [`ModelSource::check_file`] then names).
    pub fn present(&self, name: &str) -> bool {
        match self {
            ModelSource::Dir(d) => PathKind::of(&d.join(name)) != PathKind::Missing,
            ModelSource::Embedded(_) | ModelSource::Gguf(_) => self.exists(name),
        }
    }

    /// An error naming what is at `name` when it is there but not a regular file.
    pub fn check_file(&self, name: &str) -> Result<()> {
        if let ModelSource::Dir(d) = self {
            let p = d.join(name);
            if let Some(what) = PathKind::of(&p).not_a_file() {
                return Err(Error::NotAFile { path: p, what });
            }
        }
        Ok(())
    }

    /// An error when the model directory itself is missing or is not a directory.
    pub fn check_dir(&self) -> Result<()> {
        if let ModelSource::Dir(d) = self
            && let Some(what) = PathKind::of(d).not_a_dir()
        {
            return Err(Error::NotAFile { path: d.clone(), what });
        }
        Ok(())
    }

    /// Reads a whole (small) file; `Ok(None)` when it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<Cow<'static, [u8]>>> {
        match self {
            ModelSource::Dir(d) => {
                self.check_file(name)?;
                let p = d.join(name);
                match std::fs::read(&p) {
                    Ok(b) => Ok(Some(Cow::Owned(b))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::io(p, e)),
                }
            }
            ModelSource::Embedded(e) => Ok(e.files.iter().find(|(n, _)| *n == name).map(|(_, b)| Cow::Borrowed(*b))),
            ModelSource::Gguf(g) => Ok(g.file(name).map(|b| Cow::Owned(b.to_vec()))),
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
                self.check_file(name)?;
                map_file(&d.join(name))
            }
            ModelSource::Gguf(g) if g.parts.iter().any(|p| p == name) => {
                let p = g.dir.join(name);
                if let Some(what) = PathKind::of(&p).not_a_file() {
                    return Err(Error::NotAFile { path: p, what });
                }
                map_file(&p)
            }
            ModelSource::Gguf(_) => Err(Error::MissingFile {
                dir: self.dir(),
                file: name.to_string(),
                hint: "not a part of this GGUF model".into(),
            }),
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

/// Maps a file read-only.
#[allow(unsafe_code)]
fn map_file(p: &Path) -> Result<FileBytes> {
    let f = File::open(p).map_err(|e| Error::io(p, e))?;
    // SAFETY: the file is opened read-only; like every mmap-based loader we assume nobody
    // truncates a checkpoint while it is being served.
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| Error::io(p, e))?;
    Ok(FileBytes::Mmap(m))
}

/// What is at a path, told apart so that a message can name it: a symbolic link loop, a link
/// to nothing and a FIFO are not "no such file" (and reading a FIFO would block for ever).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathKind {
    File,
    Dir,
    Missing,
    /// A symbolic link whose target does not exist (the target as the link names it).
    DanglingLink(PathBuf),
    LinkLoop,
    Fifo,
    Socket,
    /// A character device (`/dev/null`, a terminal).
    CharDevice,
    BlockDevice,
    /// Anything else the OS may have.
    Special,
}

/// Links followed before a chain counts as a loop (Linux's own limit).
const MAX_LINKS: usize = 40;

impl PathKind {
    pub(crate) fn of(path: &Path) -> PathKind {
        let mut at = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            let Ok(meta) = std::fs::symlink_metadata(&at) else { return PathKind::Missing };
            if !meta.file_type().is_symlink() {
                return Self::of_type(meta.file_type());
            }
            let Ok(target) = std::fs::read_link(&at) else { return PathKind::Special };
            let next = at.parent().map_or_else(|| target.clone(), |dir| dir.join(&target));
            if std::fs::symlink_metadata(&next).is_err() {
                return PathKind::DanglingLink(target);
            }
            at = next;
        }
        PathKind::LinkLoop
    }

    fn of_type(t: std::fs::FileType) -> PathKind {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_fifo() {
                return PathKind::Fifo;
            }
            if t.is_socket() {
                return PathKind::Socket;
            }
            if t.is_char_device() {
                return PathKind::CharDevice;
            }
            if t.is_block_device() {
                return PathKind::BlockDevice;
            }
        }
        if t.is_file() {
            PathKind::File
        } else if t.is_dir() {
            PathKind::Dir
        } else {
            PathKind::Special
        }
    }

    /// What is wrong with it where a file is expected (`None` for a file, or a missing path,
    /// which callers report with what they were looking for).
    pub(crate) fn not_a_file(&self) -> Option<String> {
        self.problem("file")
    }

    /// The same where a directory is expected.
    pub(crate) fn not_a_dir(&self) -> Option<String> {
        match self {
            PathKind::Dir => None,
            PathKind::Missing => Some("no such directory".into()),
            PathKind::File => Some("a file, not a directory (a model is a directory holding config.json)".into()),
            other => other.problem("directory"),
        }
    }

    fn problem(&self, wanted: &str) -> Option<String> {
        match self {
            PathKind::File | PathKind::Missing => None,
            PathKind::Dir => Some(format!("a directory, not a {wanted}")),
            PathKind::DanglingLink(t) => Some(format!("a symbolic link to {}, which does not exist", t.display())),
            PathKind::LinkLoop => Some(format!("a symbolic link loop (following it never reaches a {wanted})")),
            PathKind::Fifo => Some(format!("a FIFO (named pipe), not a {wanted}")),
            PathKind::Socket => Some(format!("a socket, not a {wanted}")),
            PathKind::CharDevice => Some(format!("a character device, not a {wanted}")),
            PathKind::BlockDevice => Some(format!("a block device (a disk), not a {wanted}")),
            PathKind::Special => Some(format!("not a regular {wanted} (a special file)")),
        }
    }
}

impl From<&Path> for ModelSource {
    fn from(p: &Path) -> Self {
        ModelSource::Dir(p.to_path_buf())
    }
}
