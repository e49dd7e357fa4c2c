use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    DictionaryArray, FixedSizeListArray, Float32Array, Int64Array, ListArray, StringArray,
    StructArray,
};
use arrow_schema::{DataType, Field, Fields};

use super::*;
use crate::craft;

fn sample() -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("n", DataType::Int64, true),
        Field::new(
            "tag",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new(
            "v",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, true)), 2),
            true,
        ),
        Field::new(
            "l",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            true,
        ),
        Field::new(
            "s",
            DataType::Struct(Fields::from(vec![Field::new("x", DataType::Utf8, true)])),
            true,
        ),
    ]));
    let tags: DictionaryArray<Int32Type> = vec!["a", "b"].into_iter().collect();
    let v = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        2,
        Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0, 4.0])),
        None,
    );
    let l = ListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>(vec![
        Some(vec![Some(1)]),
        None,
    ]);
    let s = StructArray::from(vec![(
        Arc::new(Field::new("x", DataType::Utf8, true)),
        Arc::new(StringArray::from(vec![Some("p"), None])) as arrow_array::ArrayRef,
    )]);
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec!["a", "b"])),
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(tags),
            Arc::new(v),
            Arc::new(l),
            Arc::new(s),
        ],
    )
    .unwrap()
}

#[test]
fn every_contract_type_round_trips() {
    let batch = sample();
    let bytes = encode(&[batch.clone(), batch.clone()]).unwrap();
    let shape = inspect(&bytes, &Limits::default()).unwrap();
    assert_eq!(
        shape,
        StreamShape {
            batches: 2,
            dictionaries: 1,
            rows: 4
        }
    );
    assert_eq!(decode(bytes).unwrap(), vec![batch.clone(), batch.clone()]);
    let schema_bytes = encode_schema(&batch.schema()).unwrap();
    assert_eq!(decode_schema(&schema_bytes).unwrap(), *batch.schema());
}

#[test]
fn garbage_and_truncation_are_errors_not_allocations() {
    let mut bytes = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
    bytes.extend_from_slice(&[1, 2, 3]);
    assert!(matches!(decode(bytes), Err(WireError::Truncated { .. })));
    assert!(decode(vec![1, 2, 3]).is_err());
    let good = encode(&[sample()]).unwrap();
    for cut in [1, 7, 8, 100, good.len() - 9] {
        assert!(decode(good[..cut].to_vec()).is_err(), "cut at {cut}");
    }
    assert!(matches!(decode(vec![]), Err(WireError::NoSchema)));
}

#[test]
fn compressed_buffers_are_refused_before_decoding() {
    assert!(matches!(
        decode(craft::compressed_with_huge_length()),
        Err(WireError::Compressed { message: 1 })
    ));
}

#[test]
fn delta_and_replaced_dictionaries_are_refused() {
    assert!(matches!(
        decode(craft::delta_dictionaries(1000)),
        Err(WireError::DictionaryUpdate { message: 2, id: 0 })
    ));
    assert!(inspect(&craft::delta_dictionaries(0), &Limits::default()).is_ok());
}

#[test]
fn malformed_types_are_refused_by_name() {
    for (bytes, field) in [
        (craft::list_without_child(), "l"),
        (craft::int_of_width(7), "n"),
    ] {
        match decode(bytes) {
            Err(WireError::UnsupportedType { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn buffers_outside_the_body_are_refused() {
    assert!(matches!(
        decode(craft::buffer_outside_body()),
        Err(WireError::BadLayout { message: 1, .. })
    ));
}

#[test]
fn buffers_that_overlap_or_are_misaligned_are_refused() {
    // 4096 columns on one 8-byte buffer: Arrow would copy it once per column.
    assert!(matches!(
        decode(craft::overlapping_buffers(4096)),
        Err(WireError::BadLayout { message: 1, .. })
    ));
    assert!(matches!(
        decode(craft::misaligned_buffer()),
        Err(WireError::BadLayout { message: 1, .. })
    ));
}

#[test]
fn names_aliased_in_the_flatbuffer_are_refused() {
    // 500 fields naming one 4 MiB string: 4 MiB sent, 2 GiB expanded.
    assert!(matches!(
        decode(craft::aliased_names(500, 4 << 20)),
        Err(WireError::Malformed { message: 0, .. })
    ));
    // Long names are refused even unaliased.
    assert!(matches!(
        decode(craft::aliased_names(1, 1000)),
        Err(WireError::TooLarge { .. })
    ));
}

#[test]
fn limits_bound_rows_depth_fields_messages_and_bytes() {
    let limits = Limits {
        max_rows: 10,
        ..Limits::default()
    };
    assert!(matches!(
        decode_with(craft::rows_claimed(11), &limits),
        Err(WireError::TooLarge { what: "rows", .. })
    ));
    assert!(matches!(
        decode(craft::nested_lists(20)),
        Err(WireError::TooLarge {
            what: "levels of nesting",
            ..
        })
    ));
    // Deeper still, the flatbuffer verifier's own depth bound refuses it.
    assert!(decode(craft::nested_lists(1000)).is_err());
    let batch = sample();
    let bytes = encode(&vec![batch.clone(); 5]).unwrap();
    for (limits, what) in [
        (
            Limits {
                max_messages: 3,
                ..Limits::default()
            },
            "messages",
        ),
        (
            Limits {
                max_fields: 5,
                ..Limits::default()
            },
            "fields",
        ),
        (
            Limits {
                max_bytes: 100,
                ..Limits::default()
            },
            "bytes",
        ),
    ] {
        match inspect(&bytes, &limits) {
            Err(WireError::TooLarge { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn a_schema_stream_holds_only_the_schema() {
    let bytes = encode(&[sample()]).unwrap();
    assert!(matches!(
        decode_schema(&bytes),
        Err(WireError::BadLayout { .. })
    ));
}

/// Deterministic xorshift, so a failure names its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A bounded property test over mutated streams: flipped bytes, overwritten
/// words (lengths, offsets), truncations and splices of valid and hostile
/// streams. The decoder must answer every one with `Ok` or an error — never
/// a panic (the backstop would report `DecoderPanicked`), an abort or a hang.
#[test]
fn mutated_streams_never_panic_the_decoder() {
    let seeds = [
        encode(&[sample()]).unwrap(),
        encode(&[sample(), sample()]).unwrap(),
        encode_schema(&sample().schema()).unwrap(),
        craft::compressed_with_huge_length(),
        craft::delta_dictionaries(3),
        craft::buffer_outside_body(),
        craft::rows_claimed(3),
        craft::overlapping_buffers(3),
        craft::aliased_names(3, 8),
    ];
    let base: u64 = std::env::var("LC_WIRE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let cases: usize = std::env::var("LC_WIRE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    for case in 0..cases {
        let seed = base
            .wrapping_add(case as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            | 1;
        let mut rng = Rng(seed);
        let mut bytes = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(4) {
            if bytes.is_empty() {
                break;
            }
            match rng.below(5) {
                0 => {
                    let at = rng.below(bytes.len());
                    bytes[at] ^= 1 << rng.below(8);
                }
                1 => {
                    let at = rng.below(bytes.len());
                    let word = [0u32, 1, 0x7fff_ffff, 0xffff_ffff, 1 << 30, 8, 64];
                    let w = word[rng.below(word.len())].to_le_bytes();
                    for (i, b) in w.iter().enumerate() {
                        if let Some(x) = bytes.get_mut(at + i) {
                            *x = *b;
                        }
                    }
                }
                2 => {
                    let at = rng.below(bytes.len());
                    bytes.truncate(at);
                }
                3 => {
                    let other = &seeds[rng.below(seeds.len())];
                    let from = rng.below(other.len());
                    let at = rng.below(bytes.len());
                    bytes.splice(at..at, other[from..].iter().copied().take(64));
                }
                _ => {
                    let at = rng.below(bytes.len());
                    bytes[at] = rng.next() as u8;
                }
            }
        }
        if let Err(WireError::DecoderPanicked(p)) = decode(bytes.clone()) {
            panic!("seed {seed}: the decoder panicked: {p}");
        }
        if let Err(WireError::DecoderPanicked(p)) = decode_schema(&bytes) {
            panic!("seed {seed}: the schema decoder panicked: {p}");
        }
    }
}
