//! The GGUF container (versions 2 and 3): the header, the metadata table, the tensor infos and
//! where the data starts. It reads from a byte slice (a mapped file), checks every length and
//! offset against the slice before it reads, and says which field at which offset was wrong:
//! a truncated file, a wrong magic, a tensor whose bytes run past the end are errors, never a
//! read past the mapping.

use std::collections::BTreeMap;

use super::types::GgmlType;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, whatever its width (a negative one is not).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's entry: its name, shape (ggml order: the row length first), type, and where its
/// bytes are (from the start of the file).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    /// The type id as stored; `ty` is `None` for an id ggml does not define.
    pub type_id: u32,
    pub ty: Option<GgmlType>,
    /// Absolute offset of the first byte in the file.
    pub offset: u64,
    pub bytes: u64,
}

impl TensorInfo {
    pub fn values(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The type's name, or `type id N` for an unknown one.
    pub fn type_name(&self) -> String {
        self.ty.map_or_else(|| format!("type id {}", self.type_id), |t| t.name().to_string())
    }
}

/// A parsed GGUF header: everything but the tensor data.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

/// What is wrong with a GGUF file: the field, the offset, what was expected and found.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what} (at byte {offset})")]
pub struct GgufError {
    pub offset: u64,
    pub what: String,
}

impl GgufError {
    /// An error at `offset`. Names read from the file (keys, tensor names) are in `what`: their
    /// control characters are escaped and the whole is kept to one line of at most 400
    /// characters, whatever the file holds.
    fn at(offset: u64, what: String) -> GgufError {
        let mut what: String =
            what.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect();
        if what.chars().count() > 400 {
            what = what.chars().take(399).chain(['…']).collect();
        }
        GgufError { offset, what }
    }
}

const MAGIC: &[u8; 4] = b"GGUF";
/// Metadata arrays and strings longer than this are refused: no real file comes near (the
/// largest are the tokenizer's 248k tokens), and a corrupt count must not allocate gigabytes.
const MAX_COUNT: u64 = 1 << 26;
const MAX_DIMS: u32 = 4;

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn fail<T>(&self, what: impl Into<String>) -> Result<T, GgufError> {
        Err(GgufError::at(self.at as u64, what.into()))
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let left = (self.b.len() - self.at) as u64;
        if n > left {
            return self.fail(format!("truncated: {what} needs {n} bytes, {left} left in the file"));
        }
        let s = &self.b[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn count(&mut self, what: &str) -> Result<u64, GgufError> {
        let at = self.at;
        let n = self.u64(what)?;
        if n > MAX_COUNT {
            return Err(GgufError::at(at as u64, format!("{what} is {n}: more than any GGUF holds")));
        }
        Ok(n)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.count(&format!("{what}'s length"))?;
        let at = self.at;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::at(at as u64, format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(key)?[0]),
            1 => Value::I8(self.array::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return self.fail(format!("{key}: a bool is 0 or 1, found {b}")),
            },
            8 => Value::Str(self.string(key)?),
            9 if depth == 0 => {
                let item = self.u32(&format!("{key}'s item type"))?;
                let n = self.count(&format!("{key}'s item count"))?;
                let mut items = Vec::with_capacity(n.min(1 << 16) as usize);
                for _ in 0..n {
                    items.push(self.value(item, key, depth + 1)?);
                }
                Value::Array(items)
            }
            9 => return self.fail(format!("{key}: an array of arrays (GGUF writers never nest them)")),
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            t => return self.fail(format!("{key}: unknown metadata value type {t} (GGUF defines 0–12)")),
        })
    }
}

impl Gguf {
    /// Parses the header of `bytes`, the whole file. The tensors' bytes are checked to lie in
    /// the file and to be as long as their type and shape say; their contents are not read.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut r = Reader { b: bytes, at: 0 };
        let magic = r.array::<4>("the magic")?;
        if &magic != MAGIC {
            return Err(GgufError::at(0, format!("not a GGUF file: the magic is {magic:02x?}, expected \"GGUF\"")));
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::at(4, format!("GGUF version {version}: deltascope reads versions 2 and 3")));
        }
        let n_tensors = r.count("the tensor count")?;
        let n_kv = r.count("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key {i}"))?;
            let ty = r.u32(&format!("{key}'s value type"))?;
            let v = r.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return r.fail(format!("general.alignment is {v:?}: it must be a power of two"));
                }
            },
        };
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for i in 0..n_tensors {
            tensors.push(tensor_info(&mut r, i)?);
        }
        let data_offset = (r.at as u64).div_ceil(alignment) * alignment;
        for t in &mut tensors {
            place(t, data_offset, alignment, bytes.len() as u64)?;
        }
        Ok(Gguf { version, metadata, tensors, alignment, data_offset })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn tensor_info(r: &mut Reader, i: u64) -> Result<TensorInfo, GgufError> {
    let name = r.string(&format!("tensor {i}'s name"))?;
    let at = r.at;
    let n_dims = r.u32(&format!("{name}'s dimension count"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::at(at as u64, format!("{name} has {n_dims} dimensions (1–4)")));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(r.u64(&format!("{name}'s dimension {d}"))?);
    }
    let at = r.at;
    let type_id = r.u32(&format!("{name}'s type"))?;
    let offset = r.u64(&format!("{name}'s offset"))?;
    let ty = GgmlType::from_id(type_id);
    // The byte size follows from the type and shape; an unknown type is kept (and refused by
    // name when the tensor is needed), its size unknown.
    let values = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let bytes = match (ty, values) {
        (_, None) => {
            return Err(GgufError::at(at as u64, format!("{name}'s shape {dims:?} overflows")));
        }
        (None, Some(_)) => 0,
        (Some(t), Some(_)) => {
            let rows: u64 = dims[1..].iter().product();
            let row = t.row_bytes(dims[0]).ok_or_else(|| {
                GgufError::at(
                    at as u64,
                    format!(
                        "{name}: a row of {} values is not whole {} blocks of {}",
                        dims[0],
                        t.name(),
                        t.block_values()
                    ),
                )
            })?;
            row.checked_mul(rows).ok_or_else(|| GgufError::at(at as u64, format!("{name}'s byte size overflows")))?
        }
    };
    Ok(TensorInfo { name, dims, type_id, ty, offset, bytes })
}

/// Makes the tensor's offset absolute and checks that its bytes lie in the file.
fn place(t: &mut TensorInfo, data_offset: u64, alignment: u64, file_len: u64) -> Result<(), GgufError> {
    if !t.offset.is_multiple_of(alignment) {
        return Err(GgufError::at(
            data_offset,
            format!("{}: offset {} is not a multiple of the alignment {alignment}", t.name, t.offset),
        ));
    }
    let start = data_offset.checked_add(t.offset);
    let end = start.and_then(|s| s.checked_add(t.bytes));
    match (start, end) {
        (Some(s), Some(e)) if e <= file_len => {
            t.offset = s;
            Ok(())
        }
        _ => Err(GgufError::at(
            data_offset.saturating_add(t.offset),
            format!(
                "{}: {} bytes of {} {:?} at data offset {} run past the end of the file ({file_len} bytes): truncated?",
                t.name,
                t.bytes,
                t.type_name(),
                t.dims,
                t.offset
            ),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GGUF v3 file in memory: metadata (key, type, value bytes) and tensors (name, dims,
    /// type id, data), laid out as the writers do.
    pub(crate) fn file(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((kv.len() as u64).to_le_bytes());
        let s = |b: &mut Vec<u8>, t: &str| {
            b.extend((t.len() as u64).to_le_bytes());
            b.extend(t.as_bytes());
        };
        for (k, ty, v) in kv {
            s(&mut b, k);
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        let mut offset = 0u64;
        let mut data = vec![];
        for (name, dims, ty, bytes) in tensors {
            s(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
            data.extend(bytes);
            let padded = data.len().div_ceil(32) * 32;
            data.resize(padded, 0);
            offset = padded as u64;
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend(data);
        b
    }

    pub(crate) fn string(v: &str) -> Vec<u8> {
        let mut b = (v.len() as u64).to_le_bytes().to_vec();
        b.extend(v.as_bytes());
        b
    }

    fn one() -> Vec<u8> {
        file(
            &[("general.architecture", 8, string("qwen35")), ("qwen35.block_count", 4, 24u32.to_le_bytes().to_vec())],
            &[("output_norm.weight", &[8], 0, vec![0; 32]), ("blk.0.attn_qkv.weight", &[32, 2], 8, vec![1; 68])],
        )
    }

    #[test]
    fn a_well_formed_file_reads_whole() {
        let b = one();
        let g = Gguf::parse(&b).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.architecture(), Some("qwen35"));
        assert_eq!(g.get("qwen35.block_count").and_then(Value::as_u64), Some(24));
        let t = g.tensor("blk.0.attn_qkv.weight").unwrap();
        assert_eq!((t.ty, t.bytes, t.values()), (Some(GgmlType::Q8_0), 68, 64));
        assert_eq!(&b[t.offset as usize..][..68], &[1; 68][..]);
        assert_eq!(g.data_offset % 32, 0);
    }

    #[test]
    fn every_truncation_is_an_error_with_its_offset() {
        let b = one();
        // Past the last tensor's last byte is only padding: a cut there leaves a whole file.
        let end = Gguf::parse(&b).unwrap().tensors.iter().map(|t| t.offset + t.bytes).max().unwrap();
        for cut in 0..end as usize {
            let e = Gguf::parse(&b[..cut]).unwrap_err();
            assert!(e.offset <= b.len() as u64, "{e}");
            assert!(e.what.contains("truncated") || e.what.contains("run past the end"), "cut at {cut}: {e}");
        }
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        let mut b = one();
        b[0] = b'X';
        assert!(Gguf::parse(&b).unwrap_err().to_string().contains("not a GGUF file"));
        let mut b = one();
        b[4] = 9;
        assert_eq!(
            Gguf::parse(&b).unwrap_err().to_string(),
            "GGUF version 9: deltascope reads versions 2 and 3 (at byte 4)"
        );
        // A row that is not whole blocks: 33 values of Q8_0.
        let b = file(&[], &[("t", &[33], 8, vec![0; 68])]);
        assert!(Gguf::parse(&b).unwrap_err().what.contains("t: a row of 33 values is not whole Q8_0 blocks of 32"));
        // A count no file holds.
        let mut b = one();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Gguf::parse(&b).unwrap_err().what.contains("more than any GGUF holds"));
    }

    #[test]
    fn an_unknown_type_is_kept_and_named() {
        let b = file(&[], &[("odd", &[4], 99, vec![])]);
        let g = Gguf::parse(&b).unwrap();
        assert_eq!(g.tensors[0].ty, None);
        assert_eq!(g.tensors[0].type_name(), "type id 99");
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic fuzz: flip bytes of a good file, and feed random prefixes.
        let good = one();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = good.clone();
            let i = (x as usize) % b.len();
            b[i] = (x >> 32) as u8;
            let cut = ((x >> 40) as usize) % (b.len() + 1);
            let _ = Gguf::parse(&b[..cut]);
        }
    }
}
