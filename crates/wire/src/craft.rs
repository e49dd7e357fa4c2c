//! Hostile Arrow IPC streams, built message by message, for tests of the
//! bounded decoder (here, in the host's hostile-plugin corpus, and in the
//! fuzz corpus). Each one is *parseable*: framing and flatbuffers are valid,
//! the lie is in what a message declares. Behind the `craft` feature.

use arrow_ipc::{
    BodyCompression, BodyCompressionArgs, Buffer, DictionaryBatch, DictionaryBatchArgs,
    DictionaryEncoding, DictionaryEncodingArgs, Endianness, Field, FieldArgs, FieldNode, Int,
    IntArgs, List, ListArgs, Message, MessageArgs, MessageHeader, MetadataVersion, RecordBatch,
    RecordBatchArgs, Schema, SchemaArgs, Type, Utf8, Utf8Args,
};
use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};

/// A field as the tests describe it.
#[derive(Debug, Clone)]
pub enum Ty {
    /// A signed integer of this many bits (Arrow has 8, 16, 32, 64).
    Int(i32),
    /// Utf8.
    Utf8,
    /// A list with these children (Arrow's List has exactly one).
    List(Vec<Ty>),
    /// Utf8 values, dictionary-encoded with Int32 indexes, under this id.
    Dictionary(i64),
}

/// A field's parts: type tag, type table, children, dictionary encoding.
type FieldParts<'a> = (
    Type,
    WIPOffset<UnionWIPOffset>,
    Vec<WIPOffset<Field<'a>>>,
    Option<WIPOffset<DictionaryEncoding<'a>>>,
);

fn field<'a>(fbb: &mut FlatBufferBuilder<'a>, name: &str, ty: &Ty) -> WIPOffset<Field<'a>> {
    let (type_type, type_, children, dictionary): FieldParts<'a> = match ty {
        Ty::Int(bits) => (
            Type::Int,
            Int::create(
                fbb,
                &IntArgs {
                    bitWidth: *bits,
                    is_signed: true,
                },
            )
            .as_union_value(),
            vec![],
            None,
        ),
        Ty::Utf8 => (
            Type::Utf8,
            Utf8::create(fbb, &Utf8Args {}).as_union_value(),
            vec![],
            None,
        ),
        Ty::List(items) => {
            let children = items
                .iter()
                .enumerate()
                .map(|(i, t)| field(fbb, &format!("item{i}"), t))
                .collect();
            (
                Type::List,
                List::create(fbb, &ListArgs {}).as_union_value(),
                children,
                None,
            )
        }
        Ty::Dictionary(id) => {
            let index = Int::create(
                fbb,
                &IntArgs {
                    bitWidth: 32,
                    is_signed: true,
                },
            );
            let encoding = DictionaryEncoding::create(
                fbb,
                &DictionaryEncodingArgs {
                    id: *id,
                    indexType: Some(index),
                    ..Default::default()
                },
            );
            (
                Type::Utf8,
                Utf8::create(fbb, &Utf8Args {}).as_union_value(),
                vec![],
                Some(encoding),
            )
        }
    };
    let name = fbb.create_string(name);
    let children = fbb.create_vector(&children);
    Field::create(
        fbb,
        &FieldArgs {
            name: Some(name),
            nullable: true,
            type_type,
            type_: Some(type_),
            dictionary,
            children: Some(children),
            custom_metadata: None,
        },
    )
}

/// Frame one message: continuation marker, padded metadata length, metadata,
/// body.
fn frame(metadata: &[u8], body: &[u8]) -> Vec<u8> {
    let padded = metadata.len().div_ceil(8) * 8;
    let mut out = Vec::with_capacity(8 + padded + body.len());
    out.extend_from_slice(&0xFFFF_FFFFu32.to_le_bytes());
    out.extend_from_slice(&(padded as i32).to_le_bytes());
    out.extend_from_slice(metadata);
    out.resize(8 + padded, 0);
    out.extend_from_slice(body);
    out
}

/// A schema message with these top-level fields.
pub fn schema(fields: &[(&str, Ty)]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let fields: Vec<_> = fields.iter().map(|(n, t)| field(&mut fbb, n, t)).collect();
    let fields = fbb.create_vector(&fields);
    let schema = Schema::create(
        &mut fbb,
        &SchemaArgs {
            endianness: Endianness::Little,
            fields: Some(fields),
            ..Default::default()
        },
    );
    let message = Message::create(
        &mut fbb,
        &MessageArgs {
            version: MetadataVersion::V5,
            header_type: MessageHeader::Schema,
            header: Some(schema.as_union_value()),
            bodyLength: 0,
            custom_metadata: None,
        },
    );
    fbb.finish(message, None);
    frame(fbb.finished_data(), &[])
}

/// What a crafted record batch declares.
#[derive(Debug, Clone, Default)]
pub struct BatchSpec {
    /// Row count.
    pub length: i64,
    /// (length, null count) per field node.
    pub nodes: Vec<(i64, i64)>,
    /// (offset, length) per buffer.
    pub buffers: Vec<(i64, i64)>,
    /// Declare LZ4 body compression.
    pub compressed: bool,
    /// The body bytes.
    pub body: Vec<u8>,
}

fn batch<'a>(fbb: &mut FlatBufferBuilder<'a>, spec: &BatchSpec) -> WIPOffset<RecordBatch<'a>> {
    let nodes: Vec<FieldNode> = spec
        .nodes
        .iter()
        .map(|(l, n)| FieldNode::new(*l, *n))
        .collect();
    let buffers: Vec<Buffer> = spec
        .buffers
        .iter()
        .map(|(o, l)| Buffer::new(*o, *l))
        .collect();
    let nodes = fbb.create_vector(&nodes);
    let buffers = fbb.create_vector(&buffers);
    let compression = spec
        .compressed
        .then(|| BodyCompression::create(fbb, &BodyCompressionArgs::default()));
    RecordBatch::create(
        fbb,
        &RecordBatchArgs {
            length: spec.length,
            nodes: Some(nodes),
            buffers: Some(buffers),
            compression,
            variadicBufferCounts: None,
        },
    )
}

/// A record batch message.
pub fn record_batch(spec: &BatchSpec) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let batch = batch(&mut fbb, spec);
    let message = Message::create(
        &mut fbb,
        &MessageArgs {
            version: MetadataVersion::V5,
            header_type: MessageHeader::RecordBatch,
            header: Some(batch.as_union_value()),
            bodyLength: spec.body.len() as i64,
            custom_metadata: None,
        },
    );
    fbb.finish(message, None);
    frame(fbb.finished_data(), &spec.body)
}

/// A dictionary batch message for dictionary `id`.
pub fn dictionary_batch(id: i64, delta: bool, spec: &BatchSpec) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let data = batch(&mut fbb, spec);
    let dictionary = DictionaryBatch::create(
        &mut fbb,
        &DictionaryBatchArgs {
            id,
            data: Some(data),
            isDelta: delta,
        },
    );
    let message = Message::create(
        &mut fbb,
        &MessageArgs {
            version: MetadataVersion::V5,
            header_type: MessageHeader::DictionaryBatch,
            header: Some(dictionary.as_union_value()),
            bodyLength: spec.body.len() as i64,
            custom_metadata: None,
        },
    );
    fbb.finish(message, None);
    frame(fbb.finished_data(), &spec.body)
}

/// The end-of-stream marker.
pub fn end() -> Vec<u8> {
    let mut out = 0xFFFF_FFFFu32.to_le_bytes().to_vec();
    out.extend_from_slice(&0i32.to_le_bytes());
    out
}

/// One Int64 column `n` of one row, as a well-formed batch.
fn one_int64_row() -> BatchSpec {
    BatchSpec {
        length: 1,
        nodes: vec![(1, 0)],
        buffers: vec![(0, 0), (0, 8)],
        compressed: false,
        body: 7i64.to_le_bytes().to_vec(),
    }
}

/// An Int64 batch declaring LZ4 compression whose buffer claims an
/// uncompressed length of 2^62 bytes (Arrow would try to allocate it).
pub fn compressed_with_huge_length() -> Vec<u8> {
    let mut body = (1i64 << 62).to_le_bytes().to_vec();
    body.extend_from_slice(&[0x04, 0x22, 0x4d, 0x18, 0, 0, 0, 0]);
    let mut out = schema(&[("n", Ty::Int(64))]);
    out.extend(record_batch(&BatchSpec {
        compressed: true,
        buffers: vec![(0, 0), (0, 16)],
        body,
        ..one_int64_row()
    }));
    out.extend(end());
    out
}

/// A dictionary column followed by `deltas` delta dictionary batches (each
/// one would make Arrow concatenate the whole dictionary again).
pub fn delta_dictionaries(deltas: usize) -> Vec<u8> {
    // Values "a": offsets [0, 1], data "a" (padded).
    let values = || BatchSpec {
        length: 1,
        nodes: vec![(1, 0)],
        buffers: vec![(0, 0), (0, 8), (8, 1)],
        compressed: false,
        body: {
            let mut b = Vec::new();
            b.extend_from_slice(&0i32.to_le_bytes());
            b.extend_from_slice(&1i32.to_le_bytes());
            b.extend_from_slice(b"a\0\0\0\0\0\0\0");
            b
        },
    };
    let mut out = schema(&[("d", Ty::Dictionary(0))]);
    out.extend(dictionary_batch(0, false, &values()));
    for _ in 0..deltas {
        out.extend(dictionary_batch(0, true, &values()));
    }
    out.extend(end());
    out
}

/// A List field without its child (Arrow's reader unwraps the child).
pub fn list_without_child() -> Vec<u8> {
    let mut out = schema(&[("l", Ty::List(vec![]))]);
    out.extend(end());
    out
}

/// An integer field of `bits` bits (Arrow's reader has no such width).
pub fn int_of_width(bits: i32) -> Vec<u8> {
    let mut out = schema(&[("n", Ty::Int(bits))]);
    out.extend(record_batch(&one_int64_row()));
    out.extend(end());
    out
}

/// An Int64 batch whose values buffer points past the end of its body.
pub fn buffer_outside_body() -> Vec<u8> {
    let mut out = schema(&[("n", Ty::Int(64))]);
    out.extend(record_batch(&BatchSpec {
        buffers: vec![(0, 0), (1 << 40, 8)],
        ..one_int64_row()
    }));
    out.extend(end());
    out
}

/// An Int64 batch claiming `rows` rows with an 8-byte body.
pub fn rows_claimed(rows: i64) -> Vec<u8> {
    let mut out = schema(&[("n", Ty::Int(64))]);
    out.extend(record_batch(&BatchSpec {
        length: rows,
        nodes: vec![(rows, 0)],
        ..one_int64_row()
    }));
    out.extend(end());
    out
}

/// A list nested `depth` levels deep around an Int64 leaf.
pub fn nested_lists(depth: usize) -> Vec<u8> {
    let mut ty = Ty::Int(64);
    for _ in 0..depth {
        ty = Ty::List(vec![ty]);
    }
    let mut out = schema(&[("deep", ty)]);
    out.extend(end());
    out
}

/// `columns` Int64 columns of one row whose values buffers all point at the
/// same 8 bytes (Arrow would copy or check them once per column).
pub fn overlapping_buffers(columns: usize) -> Vec<u8> {
    let fields: Vec<(String, Ty)> = (0..columns)
        .map(|i| (format!("c{i}"), Ty::Int(64)))
        .collect();
    let named: Vec<(&str, Ty)> = fields
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let mut out = schema(&named);
    out.extend(record_batch(&BatchSpec {
        length: 1,
        nodes: vec![(1, 0); columns],
        buffers: (0..columns).flat_map(|_| [(0, 0), (0, 8)]).collect(),
        compressed: false,
        body: 7i64.to_le_bytes().to_vec(),
    }));
    out.extend(end());
    out
}

/// An Int64 batch whose values buffer starts off the 8-byte grid.
pub fn misaligned_buffer() -> Vec<u8> {
    let mut out = schema(&[("n", Ty::Int(64))]);
    out.extend(record_batch(&BatchSpec {
        buffers: vec![(0, 0), (1, 8)],
        body: vec![0u8; 16],
        ..one_int64_row()
    }));
    out.extend(end());
    out
}

/// A schema of `fields` Utf8 fields whose names all point at one string of
/// `name_bytes` bytes (small as sent, huge as expanded).
pub fn aliased_names(fields: usize, name_bytes: usize) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let name = fbb.create_string(&"n".repeat(name_bytes));
    let utf8 = Utf8::create(&mut fbb, &Utf8Args {}).as_union_value();
    let children = fbb.create_vector::<WIPOffset<Field>>(&[]);
    let list: Vec<_> = (0..fields)
        .map(|_| {
            Field::create(
                &mut fbb,
                &FieldArgs {
                    name: Some(name),
                    nullable: true,
                    type_type: Type::Utf8,
                    type_: Some(utf8),
                    dictionary: None,
                    children: Some(children),
                    custom_metadata: None,
                },
            )
        })
        .collect();
    let list = fbb.create_vector(&list);
    let schema = Schema::create(
        &mut fbb,
        &SchemaArgs {
            endianness: Endianness::Little,
            fields: Some(list),
            ..Default::default()
        },
    );
    let message = Message::create(
        &mut fbb,
        &MessageArgs {
            version: MetadataVersion::V5,
            header_type: MessageHeader::Schema,
            header: Some(schema.as_union_value()),
            bodyLength: 0,
            custom_metadata: None,
        },
    );
    fbb.finish(message, None);
    let mut out = frame(fbb.finished_data(), &[]);
    out.extend(end());
    out
}
