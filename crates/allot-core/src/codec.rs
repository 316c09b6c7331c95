//! A small binary encoding of the engine's and the ledger's state, for the daemon's snapshots.
//!
//! The core takes no serde (STYLE.md), and the state worth saving lives in private fields of
//! many modules; each module states its fields with `codec_struct!` next to the type, so a
//! field added without a codec line fails to compile instead of being silently dropped.
//!
//! Decoding never panics and never allocates more than the input could describe: every length
//! is checked against the bytes left, and a bad tag or a short input is a `CodecError`.
//! The format is little-endian, with lengths as `u64`; it is versioned by the caller.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What went wrong reading encoded state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecError(pub String);

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CodecError {}

pub(crate) fn bad(what: &str) -> CodecError {
    CodecError(format!("encoded state is damaged or from another version: {what}"))
}

pub(crate) trait Codec: Sized {
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError>;
    /// The fewest bytes one value takes (bounds the length of a sequence before allocating).
    const MIN_BYTES: usize = 1;
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], CodecError> {
    if input.len() < n {
        return Err(bad("input ends early"));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

macro_rules! codec_int {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
                let bytes = take(input, std::mem::size_of::<$t>())?;
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                Ok(<$t>::from_le_bytes(a))
            }
            const MIN_BYTES: usize = std::mem::size_of::<$t>();
        }
    )*};
}
codec_int!(u8, u16, u32, u64, u128, i32);

impl Codec for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        match u8::decode(input)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(bad("a flag is neither 0 nor 1")),
        }
    }
}

impl Codec for f64 {
    fn encode(&self, out: &mut Vec<u8>) {
        self.to_bits().encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok(f64::from_bits(u64::decode(input)?))
    }
    const MIN_BYTES: usize = 8;
}

fn decode_len<T: Codec>(input: &mut &[u8]) -> Result<usize, CodecError> {
    let n = u64::decode(input)?;
    let n = usize::try_from(n).map_err(|_| bad("a length does not fit in memory"))?;
    if n.saturating_mul(T::MIN_BYTES.max(1)) > input.len() {
        return Err(bad("a length runs past the end"));
    }
    Ok(n)
}

impl Codec for String {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.len() as u64).encode(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let n = decode_len::<u8>(input)?;
        let bytes = take(input, n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| bad("text is not UTF-8"))
    }
    const MIN_BYTES: usize = 8;
}

impl<T: Codec> Codec for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.encode(out);
            }
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        match u8::decode(input)? {
            0 => Ok(None),
            1 => Ok(Some(T::decode(input)?)),
            _ => Err(bad("an option tag is neither 0 nor 1")),
        }
    }
}

impl<A: Codec, B: Codec> Codec for (A, B) {
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
        self.1.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok((A::decode(input)?, B::decode(input)?))
    }
    const MIN_BYTES: usize = A::MIN_BYTES + B::MIN_BYTES;
}

impl<A: Codec, B: Codec, C: Codec> Codec for (A, B, C) {
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
        self.1.encode(out);
        self.2.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok((A::decode(input)?, B::decode(input)?, C::decode(input)?))
    }
    const MIN_BYTES: usize = A::MIN_BYTES + B::MIN_BYTES + C::MIN_BYTES;
}

impl<A: Codec, B: Codec, C: Codec, D: Codec> Codec for (A, B, C, D) {
    fn encode(&self, out: &mut Vec<u8>) {
        self.0.encode(out);
        self.1.encode(out);
        self.2.encode(out);
        self.3.encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        Ok((A::decode(input)?, B::decode(input)?, C::decode(input)?, D::decode(input)?))
    }
    const MIN_BYTES: usize = A::MIN_BYTES + B::MIN_BYTES + C::MIN_BYTES + D::MIN_BYTES;
}

macro_rules! codec_seq {
    ($ty:ident, $push:ident, $bound:path) => {
        impl<T: Codec + $bound> Codec for $ty<T> {
            fn encode(&self, out: &mut Vec<u8>) {
                (self.len() as u64).encode(out);
                for item in self {
                    item.encode(out);
                }
            }
            fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
                let n = decode_len::<T>(input)?;
                let mut items = $ty::new();
                for _ in 0..n {
                    items.$push(Codec::decode(input)?);
                }
                Ok(items)
            }
            const MIN_BYTES: usize = 8;
        }
    };
}

/// Nothing extra: for sequences whose items need no ordering.
pub(crate) trait Any {}
impl<T> Any for T {}

codec_seq!(Vec, push, Any);
codec_seq!(VecDeque, push_back, Any);
codec_seq!(BTreeSet, insert, Ord);

impl<K: Codec + Ord, V: Codec> Codec for BTreeMap<K, V> {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.len() as u64).encode(out);
        for (k, v) in self {
            k.encode(out);
            v.encode(out);
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let n = decode_len::<(K, V)>(input)?;
        let mut map = BTreeMap::new();
        for _ in 0..n {
            let k = K::decode(input)?;
            map.insert(k, V::decode(input)?);
        }
        Ok(map)
    }
    const MIN_BYTES: usize = 8;
}

/// `Codec` for a struct from the list of its fields (all of them: the struct literal in
/// `decode` fails to compile if one is missing).
macro_rules! codec_struct {
    ($ty:ty { $($field:ident),* $(,)? }) => {
        impl $crate::codec::Codec for $ty {
            fn encode(&self, out: &mut Vec<u8>) {
                $( $crate::codec::Codec::encode(&self.$field, out); )*
            }
            fn decode(input: &mut &[u8]) -> Result<Self, $crate::codec::CodecError> {
                Ok(Self { $( $field: $crate::codec::Codec::decode(input)?, )* })
            }
        }
    };
}
pub(crate) use codec_struct;

/// `Codec` for a one-field tuple struct (the id newtypes).
macro_rules! codec_newtype {
    ($($ty:ident),*) => {$(
        impl Codec for crate::ids::$ty {
            fn encode(&self, out: &mut Vec<u8>) {
                self.0.encode(out);
            }
            fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
                Ok(crate::ids::$ty(Codec::decode(input)?))
            }
            const MIN_BYTES: usize = 1;
        }
    )*};
}
codec_newtype!(Timestamp, WorkloadId, NodeId, ProjectId, ModelId, Shares);

/// `Codec` for a fieldless enum, by variant index.
macro_rules! codec_unit_enum {
    ($ty:ty { $($variant:ident),* $(,)? }) => {
        impl $crate::codec::Codec for $ty {
            fn encode(&self, out: &mut Vec<u8>) {
                let variants = [$(<$ty>::$variant),*];
                let index = variants.iter().position(|v| v == self).unwrap_or(0);
                out.push(index as u8);
            }
            fn decode(input: &mut &[u8]) -> Result<Self, $crate::codec::CodecError> {
                let variants = [$(<$ty>::$variant),*];
                let index = usize::from(<u8 as $crate::codec::Codec>::decode(input)?);
                variants.get(index).copied().ok_or_else(|| {
                    $crate::codec::bad(concat!("unknown ", stringify!($ty)))
                })
            }
        }
    };
}
pub(crate) use codec_unit_enum;

/// Encodes a value (crate-internal types only).
pub(crate) fn to_bytes<T: Codec>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.encode(&mut out);
    out
}

/// Decodes a whole input: trailing bytes are an error.
pub(crate) fn from_bytes<T: Codec>(mut input: &[u8]) -> Result<T, CodecError> {
    let value = T::decode(&mut input)?;
    if !input.is_empty() {
        return Err(bad("bytes left over"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_damage_is_an_error() {
        let value: (BTreeMap<u64, Vec<Option<String>>>, f64) =
            (BTreeMap::from([(3, vec![None, Some("é".to_string())])]), -0.1);
        let bytes = to_bytes(&value);
        let back: (BTreeMap<u64, Vec<Option<String>>>, f64) =
            from_bytes(&bytes).expect("round trip");
        assert_eq!(back, value);
        for cut in 0..bytes.len() {
            assert!(
                from_bytes::<(BTreeMap<u64, Vec<Option<String>>>, f64)>(&bytes[..cut]).is_err()
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(from_bytes::<(BTreeMap<u64, Vec<Option<String>>>, f64)>(&long).is_err());
    }

    #[test]
    fn a_huge_length_is_refused_before_allocating() {
        let mut bytes = Vec::new();
        u64::MAX.encode(&mut bytes);
        assert!(from_bytes::<Vec<u64>>(&bytes).is_err());
        assert!(from_bytes::<String>(&bytes).is_err());
    }
}
