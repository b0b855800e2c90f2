//! Avro binary primitives, written the way fastavro (and the Python reference's compiled writer,
//! `core/encoding/avro_writer.py`) writes them: zigzag varints, length-prefixed bytes and strings,
//! little-endian IEEE floats, arrays and maps as one block followed by the zero terminator.

/// The union branch index of `["null", T]`, zigzag-encoded: 0 selects null, 1 (0x02) the value.
pub const NULL_BRANCH: u8 = 0x00;
pub const VALUE_BRANCH: u8 = 0x02;
/// fastavro ends every array and map (written as a single block) with a zero count.
pub const END_OF_BLOCKS: u8 = 0x00;

/// An unsigned base-128 varint (the zigzag step is the caller's).
#[inline]
pub fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7F) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Avro's int and long: zigzag (`(n << 1) ^ (n >> 63)`), then a varint.
#[inline]
pub fn write_long(out: &mut Vec<u8>, value: i64) {
    write_varint(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// Avro bytes and string: the length as a long, then the bytes.
#[inline]
pub fn write_bytes(out: &mut Vec<u8>, data: &[u8]) {
    write_varint(out, (data.len() as u64) << 1);
    out.extend_from_slice(data);
}

/// A block count (arrays, maps): the reference writes `varint(len << 1)`.
#[inline]
pub fn write_count(out: &mut Vec<u8>, count: usize) {
    write_varint(out, (count as u64) << 1);
}

#[inline]
pub fn write_float(out: &mut Vec<u8>, value: f32) {
    out.extend_from_slice(&value.to_le_bytes());
}

#[inline]
pub fn write_double(out: &mut Vec<u8>, value: f64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// The Confluent wire format's prefix: magic byte 0, then the schema id, 4 bytes big-endian.
pub fn confluent_prefix(schema_id: u32) -> Vec<u8> {
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&schema_id.to_be_bytes());
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(value: i64) -> Vec<u8> {
        let mut out = Vec::new();
        write_long(&mut out, value);
        out
    }

    #[test]
    fn zigzag_varints_match_the_avro_spec() {
        assert_eq!(long(0), [0x00]);
        assert_eq!(long(-1), [0x01]);
        assert_eq!(long(1), [0x02]);
        assert_eq!(long(-2), [0x03]);
        assert_eq!(long(63), [0x7E]);
        assert_eq!(long(-64), [0x7F]);
        assert_eq!(long(64), [0x80, 0x01]);
        assert_eq!(long(-32768), [0xFF, 0xFF, 0x03]);
        assert_eq!(
            long(i64::MAX),
            [0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
        assert_eq!(
            long(i64::MIN),
            [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]
        );
    }

    #[test]
    fn strings_and_counts_are_length_prefixed() {
        let mut out = Vec::new();
        write_bytes(&mut out, b"abc");
        assert_eq!(out, b"\x06abc");
        out.clear();
        write_bytes(&mut out, &[7u8; 200]);
        assert_eq!(&out[..2], &[0x90, 0x03]);
        assert_eq!(out.len(), 202);
        out.clear();
        write_count(&mut out, 3);
        assert_eq!(out, [0x06]);
    }

    #[test]
    fn floats_are_little_endian_ieee() {
        let mut out = Vec::new();
        write_float(&mut out, 1.1f64 as f32);
        assert_eq!(out, 1.1f32.to_le_bytes());
        out.clear();
        write_double(&mut out, f64::NEG_INFINITY);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 0xF0, 0xFF]);
        assert_eq!(confluent_prefix(258), [0, 0, 0, 1, 2]);
    }
}
