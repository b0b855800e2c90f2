//! The tests of `spooled.rs`: records parsed, framed and scanned, and headed as the reference.

use super::*;

fn change(op: u8, oid: u32, key: Option<&[u8]>, value: Option<&[u8]>, unchanged: &[u8]) -> Vec<u8> {
    let mut record = vec![CHANGE, op];
    record.extend_from_slice(&oid.to_be_bytes());
    record.extend_from_slice(&key.map_or(-1, |k| k.len() as i32).to_be_bytes());
    record.extend_from_slice(&value.map_or(-1, |v| v.len() as i32).to_be_bytes());
    record.extend_from_slice(&(unchanged.len() as u16).to_be_bytes());
    record.extend_from_slice(&(-1i16).to_be_bytes());
    record.extend_from_slice(key.unwrap_or_default());
    record.extend_from_slice(value.unwrap_or_default());
    record.extend_from_slice(unchanged);
    record
}

fn block(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        out.extend_from_slice(&(record.len() as u32).to_be_bytes());
        out.extend_from_slice(record);
    }
    out
}

#[test]
fn parses_changes_and_skips() {
    let record = change(b'u', 7, Some(b"k"), Some(b"value"), b"a,b");
    assert_eq!(
        parse(&record),
        Some(Spooled::Change {
            op: b'u',
            oid: 7,
            key: Some(b"k"),
            value: Some(b"value"),
            unchanged: b"a,b"
        })
    );
    let tombstone = change(b'd', 7, Some(b"k"), None, b"");
    assert!(matches!(
        parse(&tombstone),
        Some(Spooled::Change { value: None, .. })
    ));
    assert_eq!(parse(b"S"), Some(Spooled::Skip));
}

#[test]
fn leaves_other_kinds_key_texts_and_malformed_records_to_the_caller() {
    assert_eq!(parse(b"M\x52relation"), None);
    assert_eq!(parse(b"X\x00\x00\x00\x07\x00oops"), None);
    assert_eq!(parse(b""), None);
    let mut with_key_text = change(b'c', 7, Some(b"k"), Some(b"v"), b"");
    with_key_text[16..18].copy_from_slice(&0i16.to_be_bytes());
    assert_eq!(parse(&with_key_text), None);
    let whole = change(b'c', 7, Some(b"k"), Some(b"v"), b"");
    assert_eq!(parse(&whole[..whole.len() - 1]), None, "truncated");
    assert_eq!(parse(&[whole.as_slice(), b"x"].concat()), None, "trailing bytes");
    assert_eq!(parse(&change(b'r', 7, None, None, b"")), None, "not a stream op");
}

#[test]
fn scans_a_block_up_to_the_first_record_it_does_not_take() {
    let records = [
        change(b'c', 7, Some(b"1"), Some(b"one"), b""),
        b"S".to_vec(),
        change(b'c', 8, Some(b"2"), Some(b"two"), b""),
        b"Mkept".to_vec(),
    ];
    let bytes = block(&records);
    let (taken, span) = scan(framed(&bytes, 0), |oid| oid == 7, 100);
    assert_eq!(taken.len(), 2);
    assert_eq!(span, 4 + records[0].len() + 4 + 1);
    let (taken, span) = scan(framed(&bytes, 0), |_| true, 100);
    assert_eq!((taken.len(), span), (3, bytes.len() - 4 - records[3].len()));
    let (taken, _) = scan(framed(&bytes, 0), |_| true, 1);
    assert_eq!(taken.len(), 1, "at most the limit");
    assert_eq!(
        framed(&bytes[..bytes.len() - 1], 0).count(),
        3,
        "a record cut short ends it"
    );
}

#[test]
fn numbers_and_heads_each_change_as_the_reference_does() {
    let records = [
        change(b'c', 7, Some(b"1"), Some(b"one"), b""),
        b"S".to_vec(),
        change(b'u', 7, Some(b"2"), Some(b"two"), b"big,doc"),
    ];
    let parsed: Vec<_> = records.iter().map(|r| parse(r).unwrap()).collect();
    let targets = HashMap::from([(7, ("db.items".to_owned(), 3))]);
    let commit = CommitHeaders {
        lsn: b"123",
        xid: b"9",
        commit_ts: b"2026-11-27T00:00:00.000000Z",
    };
    let out: Vec<_> = messages(&parsed, &targets, &commit, 41).collect();
    assert!(out[1].is_none());
    let (topic, key, value, headers, batch) = out[2].as_ref().unwrap();
    assert_eq!(
        (*topic, *key, *value, *batch),
        ("db.items", Some(&b"2"[..]), Some(&b"two"[..]), 3)
    );
    let pairs: Vec<_> = headers.iter().map(|h| (h.key, h.value.unwrap())).collect();
    assert_eq!(
        pairs,
        [
            ("bw.op", &b"u"[..]),
            ("bw.lsn", b"123"),
            ("bw.seq", b"43"),
            ("bw.xid", b"9"),
            ("bw.commit_ts", b"2026-11-27T00:00:00.000000Z"),
            ("bw.unchanged", b"big,doc"),
        ]
    );
    let first = out[0].as_ref().unwrap();
    assert_eq!(first.3.count(), 5, "no bw.unchanged when none");
}

#[test]
fn heads_a_change_produced_before_its_commit_without_lsn_and_commit_time() {
    let records = [change(b'd', 7, Some(b"2"), None, b"doc")];
    let parsed: Vec<_> = records.iter().map(|r| parse(r).unwrap()).collect();
    let targets = HashMap::from([(7, ("db.items".to_owned(), 0))]);
    let early = CommitHeaders {
        lsn: b"",
        xid: b"9",
        commit_ts: b"",
    };
    let out: Vec<_> = messages(&parsed, &targets, &early, 5).collect();
    let headers = &out[0].as_ref().unwrap().3;
    let pairs: Vec<_> = headers.iter().map(|h| (h.key, h.value.unwrap())).collect();
    assert_eq!(
        pairs,
        [
            ("bw.op", &b"d"[..]),
            ("bw.seq", b"5"),
            ("bw.xid", b"9"),
            ("bw.unchanged", b"doc"),
        ]
    );
}
