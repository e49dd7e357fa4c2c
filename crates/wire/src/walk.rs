//! The walk over an untrusted Arrow IPC stream, before any of it is decoded.
//!
//! A stream is a sequence of encapsulated messages: an optional continuation
//! marker (`0xFFFFFFFF`), a little-endian `i32` metadata length, the metadata
//! (a flatbuffer `Message`, verified here), then `bodyLength` bytes of body; a
//! zero length ends the stream. The walk checks each message against what the
//! contract carries (see the crate docs) and returns the stream's shape.

use std::collections::HashSet;

use arrow_ipc::{
    Endianness, Field, Message, MessageHeader, MetadataVersion, Precision, RecordBatch, Type,
    root_as_message_with_opts,
};

use crate::{Limits, WireError};

const CONTINUATION: u32 = 0xFFFF_FFFF;
/// Longest field name accepted.
const MAX_NAME_BYTES: usize = 256;
/// Bytes of custom metadata (keys and values) accepted per schema.
const MAX_METADATA_BYTES: usize = 64 << 10;

/// What a stream holds, once walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamShape {
    /// Record batches.
    pub batches: usize,
    /// Dictionary batches.
    pub dictionaries: usize,
    /// Rows over all record batches.
    pub rows: usize,
}

/// How one field node lays out in a record batch (pre-order, as the nodes
/// and buffers come).
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// Validity, then values of `bits` bits each (Boolean: 1; a dictionary
    /// column: its index width).
    Fixed { bits: u64 },
    /// Validity, offsets of `width` bytes, data (strings, binaries).
    Bytes { width: u64 },
    /// Validity, offsets of `width` bytes; the child follows.
    List { width: u64 },
    /// Validity; the child follows, `size` values per row.
    FixedList { size: u64 },
    /// Validity; the children follow.
    Struct,
}

impl Slot {
    fn buffers(self) -> usize {
        match self {
            Self::Fixed { .. } | Self::List { .. } => 2,
            Self::Bytes { .. } => 3,
            Self::FixedList { .. } | Self::Struct => 1,
        }
    }
}

/// The nodes of a schema: each slot with its parent's index.
#[derive(Debug, Default)]
struct Layout {
    slots: Vec<(Slot, Option<usize>)>,
    /// Dictionary ids (their batches hold one Utf8 column).
    dictionaries: Vec<i64>,
}

impl Layout {
    fn buffers(&self) -> usize {
        self.slots.iter().map(|(s, _)| s.buffers()).sum()
    }
}

/// A dictionary batch's layout: one Utf8 column.
fn dictionary_layout() -> Layout {
    Layout {
        slots: vec![(Slot::Bytes { width: 4 }, None)],
        dictionaries: Vec::new(),
    }
}

/// Walk `bytes` as an Arrow IPC stream within `limits`; refuse anything the
/// contract does not carry (see the crate docs).
pub fn inspect(bytes: &[u8], limits: &Limits) -> Result<StreamShape, WireError> {
    if bytes.len() > limits.max_bytes {
        return Err(WireError::TooLarge {
            what: "bytes",
            limit: limits.max_bytes,
        });
    }
    let mut walk = Walk::default();
    let mut pos = 0usize;
    let mut index = 0usize;
    while let Some((message, body)) = next_message(bytes, &mut pos, index, limits)? {
        match message.header_type() {
            MessageHeader::Schema => walk.schema(&message, index, limits)?,
            MessageHeader::DictionaryBatch => walk.dictionary(&message, index, body, limits)?,
            MessageHeader::RecordBatch => walk.record_batch(&message, index, body, limits)?,
            other => {
                return Err(WireError::Malformed {
                    message: index,
                    reason: format!("{other:?} messages are not part of the contract"),
                });
            }
        }
        index += 1;
    }
    if walk.layout.is_none() {
        return Err(WireError::NoSchema);
    }
    Ok(walk.shape)
}

/// The next message of the stream at `pos` (message number `index`), its
/// metadata verified, and the length of its body; `pos` moves past both.
/// `None` at the end of the stream.
fn next_message<'a>(
    bytes: &'a [u8],
    pos: &mut usize,
    index: usize,
    limits: &Limits,
) -> Result<Option<(Message<'a>, usize)>, WireError> {
    if *pos == bytes.len() {
        // A stream may end without the end-of-stream marker.
        return Ok(None);
    }
    let mut length = read_u32(bytes, *pos).ok_or(WireError::Truncated { message: index })?;
    *pos += 4;
    if length == CONTINUATION {
        length = read_u32(bytes, *pos).ok_or(WireError::Truncated { message: index })?;
        *pos += 4;
    }
    let length = i32::from_le_bytes(length.to_le_bytes());
    if length == 0 {
        if *pos != bytes.len() {
            return Err(WireError::Malformed {
                message: index,
                reason: format!(
                    "{} bytes follow the end-of-stream marker",
                    bytes.len() - *pos
                ),
            });
        }
        return Ok(None);
    }
    let length = usize::try_from(length).map_err(|_| WireError::Malformed {
        message: index,
        reason: format!("negative metadata length {length}"),
    })?;
    if index >= limits.max_messages {
        return Err(WireError::TooLarge {
            what: "messages",
            limit: limits.max_messages,
        });
    }
    let end = pos
        .checked_add(length)
        .filter(|end| *end <= bytes.len())
        .ok_or(WireError::Truncated { message: index })?;
    // A flatbuffer may point many fields at one string: bound the size of
    // the message as expanded, not only as sent.
    let verifier = flatbuffers::VerifierOptions {
        max_depth: 64,
        max_tables: 1 << 20,
        max_apparent_size: length.saturating_mul(2).saturating_add(4096),
        ignore_missing_null_terminator: false,
    };
    let message = root_as_message_with_opts(&verifier, &bytes[*pos..end]).map_err(|e| {
        WireError::Malformed {
            message: index,
            reason: e.to_string(),
        }
    })?;
    *pos = end;
    if !matches!(message.version(), MetadataVersion::V4 | MetadataVersion::V5) {
        return Err(WireError::Malformed {
            message: index,
            reason: format!("metadata version {:?} is not V4 or V5", message.version()),
        });
    }
    let body = usize::try_from(message.bodyLength()).map_err(|_| WireError::Malformed {
        message: index,
        reason: format!("negative body length {}", message.bodyLength()),
    })?;
    if pos.checked_add(body).is_none_or(|end| end > bytes.len()) {
        return Err(WireError::Truncated { message: index });
    }
    *pos += body;
    Ok(Some((message, body)))
}

/// What the walk has seen so far.
#[derive(Debug, Default)]
struct Walk {
    shape: StreamShape,
    /// The schema's layout, once its message is walked.
    layout: Option<Layout>,
    /// The dictionary ids whose batch came.
    dictionaries_seen: HashSet<i64>,
}

impl Walk {
    /// A schema message: the first message, and the only schema.
    fn schema(
        &mut self,
        message: &Message<'_>,
        index: usize,
        limits: &Limits,
    ) -> Result<(), WireError> {
        if self.layout.is_some() || index > 0 {
            return Err(WireError::Malformed {
                message: index,
                reason: "a schema message after the first message".into(),
            });
        }
        let schema = message.header_as_schema().ok_or(WireError::Malformed {
            message: index,
            reason: "the schema header is missing".into(),
        })?;
        if schema.endianness() != Endianness::Little {
            return Err(WireError::Malformed {
                message: index,
                reason: "big-endian data is not part of the contract".into(),
            });
        }
        let list = schema.fields().ok_or(WireError::Malformed {
            message: index,
            reason: "the schema has no field list".into(),
        })?;
        let mut l = Layout::default();
        for field in list.iter() {
            field_layout(&field, None, 1, limits, &mut l)?;
        }
        let mut metadata = 0usize;
        for kv in schema.custom_metadata().iter().flat_map(|m| m.iter()) {
            metadata += kv.key().map_or(0, str::len) + kv.value().map_or(0, str::len);
        }
        if metadata > MAX_METADATA_BYTES {
            return Err(WireError::TooLarge {
                what: "bytes of schema metadata",
                limit: MAX_METADATA_BYTES,
            });
        }
        self.layout = Some(l);
        Ok(())
    }

    /// A dictionary batch: once per dictionary of the schema, before the
    /// first record batch.
    fn dictionary(
        &mut self,
        message: &Message<'_>,
        index: usize,
        body: usize,
        limits: &Limits,
    ) -> Result<(), WireError> {
        let l = self.layout.as_ref().ok_or(WireError::NoSchema)?;
        let dictionary = message
            .header_as_dictionary_batch()
            .ok_or(WireError::Malformed {
                message: index,
                reason: "the dictionary header is missing".into(),
            })?;
        let id = dictionary.id();
        if !l.dictionaries.contains(&id) {
            return Err(WireError::BadLayout {
                message: index,
                reason: format!("dictionary id {id} is not in the schema"),
            });
        };
        if dictionary.isDelta() || !self.dictionaries_seen.insert(id) {
            return Err(WireError::DictionaryUpdate { message: index, id });
        }
        if self.shape.batches > 0 {
            return Err(WireError::BadLayout {
                message: index,
                reason: "a dictionary after the first record batch".into(),
            });
        }
        let data = dictionary.data().ok_or(WireError::Malformed {
            message: index,
            reason: "the dictionary batch holds no data".into(),
        })?;
        // A dictionary is bounded like the rows it serves.
        check_batch(&data, index, body, &dictionary_layout(), limits.max_rows)?;
        self.shape.dictionaries += 1;
        Ok(())
    }

    /// A record batch: after its columns' dictionaries, within the rows left.
    fn record_batch(
        &mut self,
        message: &Message<'_>,
        index: usize,
        body: usize,
        limits: &Limits,
    ) -> Result<(), WireError> {
        let l = self.layout.as_ref().ok_or(WireError::NoSchema)?;
        if self.dictionaries_seen.len() < l.dictionaries.len() {
            return Err(WireError::BadLayout {
                message: index,
                reason: "a record batch before its columns' dictionaries".into(),
            });
        }
        let batch = message
            .header_as_record_batch()
            .ok_or(WireError::Malformed {
                message: index,
                reason: "the record batch header is missing".into(),
            })?;
        let room = limits.max_rows.saturating_sub(self.shape.rows);
        let rows = check_batch(&batch, index, body, l, room)?;
        self.shape.rows += rows;
        self.shape.batches += 1;
        Ok(())
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let chunk = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(chunk.try_into().ok()?))
}

/// Check a record batch (or a dictionary's data) against the layout: no
/// compression, node and buffer counts as the schema says, every buffer
/// inside the body and as large as its node needs (Arrow's reader asserts
/// this, it does not check it), lengths and null counts sane, a child at
/// least as long as its fixed-size parent needs. Returns its row count.
fn check_batch(
    batch: &RecordBatch<'_>,
    message: usize,
    body: usize,
    layout: &Layout,
    max_rows: usize,
) -> Result<usize, WireError> {
    let bad = |reason: String| WireError::BadLayout { message, reason };
    if batch.compression().is_some() {
        return Err(WireError::Compressed { message });
    }
    if batch
        .variadicBufferCounts()
        .is_some_and(|counts| !counts.is_empty())
    {
        return Err(bad(
            "variadic buffers (view types) are not part of the contract".into(),
        ));
    }
    let rows = usize::try_from(batch.length())
        .map_err(|_| bad(format!("negative row count {}", batch.length())))?;
    if rows > max_rows {
        return Err(WireError::TooLarge {
            what: "rows",
            limit: max_rows,
        });
    }
    let nodes: Vec<(u64, u64)> = batch
        .nodes()
        .map(|n| {
            n.iter()
                .map(|n| (n.length(), n.null_count()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .map(|(length, nulls)| {
            let length = u64::try_from(length).ok();
            let nulls = u64::try_from(nulls).ok();
            match (length, nulls) {
                (Some(l), Some(n)) if n <= l => Ok((l, n)),
                _ => Err(bad(format!(
                    "a field node has length {length:?} and null count {nulls:?}"
                ))),
            }
        })
        .collect::<Result<_, _>>()?;
    if nodes.len() != layout.slots.len() {
        return Err(bad(format!(
            "{} field nodes, the schema has {}",
            nodes.len(),
            layout.slots.len()
        )));
    }
    let buffers = buffer_lengths(batch, message, body)?;
    if buffers.len() != layout.buffers() {
        return Err(bad(format!(
            "{} buffers, the schema has {}",
            buffers.len(),
            layout.buffers()
        )));
    }
    if layout
        .slots
        .first()
        .is_some_and(|(_, parent)| parent.is_none())
        && nodes
            .iter()
            .zip(&layout.slots)
            .any(|((len, _), (_, parent))| parent.is_none() && *len != rows as u64)
    {
        return Err(bad(format!(
            "a column's length differs from the batch's {rows} rows"
        )));
    }
    let mut next = 0usize;
    for (i, (slot, _)) in layout.slots.iter().enumerate() {
        check_node(layout, &nodes, &buffers, i, next, message)?;
        next += slot.buffers();
    }
    Ok(rows)
}

/// The lengths of `batch`'s buffers, each checked to lie inside the
/// `body`-byte body, 8-byte aligned, in order and apart.
fn buffer_lengths(
    batch: &RecordBatch<'_>,
    message: usize,
    body: usize,
) -> Result<Vec<u64>, WireError> {
    let bad = |reason: String| WireError::BadLayout { message, reason };
    // Buffers lie inside the body, 8-byte aligned, in order and apart: two
    // columns pointing at the same bytes would make Arrow copy (or check)
    // those bytes once per column.
    let mut end_of_previous = 0u64;
    batch
        .buffers()
        .map(|b| b.iter().map(|b| (b.offset(), b.length())).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, (offset, length))| {
            let (Ok(o), Ok(l)) = (u64::try_from(offset), u64::try_from(length)) else {
                return Err(bad(format!(
                    "buffer {i} has offset {offset} and length {length}"
                )));
            };
            let end = o.checked_add(l).filter(|end| *end <= body as u64);
            let Some(end) = end else {
                return Err(bad(format!(
                    "buffer {i} (offset {offset}, length {length}) lies outside the {body}-byte body"
                )));
            };
            if !o.is_multiple_of(8) {
                return Err(bad(format!("buffer {i} starts at {offset}, not on 8 bytes")));
            }
            if o < end_of_previous {
                return Err(bad(format!(
                    "buffer {i} (offset {offset}) overlaps or precedes the buffer before it"
                )));
            }
            end_of_previous = end;
            Ok(l)
        })
        .collect::<Result<_, _>>()
}

/// Check field node `i` (`nodes[i]`, its buffers from `buffers[next]` on)
/// against its slot in `layout`: its buffers are as large as its values
/// need, and it is as long as its parent needs.
fn check_node(
    layout: &Layout,
    nodes: &[(u64, u64)],
    buffers: &[u64],
    i: usize,
    next: usize,
    message: usize,
) -> Result<(), WireError> {
    let bad = |reason: String| WireError::BadLayout { message, reason };
    let ((slot, parent), (length, nulls)) = (&layout.slots[i], &nodes[i]);
    let short = |what: &str, need: u64, have: u64| {
        bad(format!(
            "field node {i}: its {what} buffer has {have} bytes, {need} are needed for {length} values"
        ))
    };
    let validity = buffers[next];
    let bitmap = length.div_ceil(8);
    if *nulls > 0 && validity < bitmap {
        return Err(short("validity", bitmap, validity));
    }
    match *slot {
        Slot::Fixed { bits } => {
            let need = length
                .checked_mul(bits)
                .map(|b| b.div_ceil(8))
                .ok_or_else(|| bad(format!("field node {i} is too long")))?;
            if buffers[next + 1] < need {
                return Err(short("values", need, buffers[next + 1]));
            }
            if bits >= 8 && !buffers[next + 1].is_multiple_of(bits / 8) {
                return Err(bad(format!(
                    "field node {i}: its values buffer of {} bytes is not a whole number of {bits}-bit values",
                    buffers[next + 1]
                )));
            }
        }
        Slot::Bytes { width } | Slot::List { width } => {
            let need = if *length == 0 {
                0
            } else {
                length
                    .checked_add(1)
                    .and_then(|n| n.checked_mul(width))
                    .ok_or_else(|| bad(format!("field node {i} is too long")))?
            };
            if buffers[next + 1] < need {
                return Err(short("offsets", need, buffers[next + 1]));
            }
            if !buffers[next + 1].is_multiple_of(width) {
                return Err(bad(format!(
                    "field node {i}: its offsets buffer of {} bytes is not a whole number of offsets",
                    buffers[next + 1]
                )));
            }
        }
        Slot::FixedList { .. } | Slot::Struct => {}
    }
    if let Some(p) = parent {
        let (parent_slot, _) = layout.slots[*p];
        let parent_length = nodes[*p].0;
        let need = match parent_slot {
            Slot::FixedList { size } => parent_length.checked_mul(size),
            Slot::Struct => Some(parent_length),
            _ => Some(0),
        };
        if need.is_none_or(|need| *length < need) {
            return Err(bad(format!(
                "field node {i} has {length} values, its parent needs {need:?}"
            )));
        }
    }
    Ok(())
}

/// Add `field`'s nodes (and its children's) to `layout`, refusing types
/// outside the contract (and malformed ones: a list without its child, an
/// integer of a width Arrow does not have).
fn field_layout(
    field: &Field<'_>,
    parent: Option<usize>,
    depth: usize,
    limits: &Limits,
    layout: &mut Layout,
) -> Result<(), WireError> {
    let raw_name = field.name().unwrap_or("(unnamed)");
    if raw_name.len() > MAX_NAME_BYTES {
        return Err(WireError::TooLarge {
            what: "bytes in a field name",
            limit: MAX_NAME_BYTES,
        });
    }
    let name = raw_name.to_string();
    if layout.slots.len() >= limits.max_fields {
        return Err(WireError::TooLarge {
            what: "fields",
            limit: limits.max_fields,
        });
    }
    if depth > limits.max_depth {
        return Err(WireError::TooLarge {
            what: "levels of nesting",
            limit: limits.max_depth,
        });
    }
    let children: Vec<Field<'_>> = field
        .children()
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let check = FieldCheck {
        field,
        name,
        children,
    };
    if let Some(dictionary) = field.dictionary() {
        return check.dictionary_slot(&dictionary, parent, layout);
    }
    let slot = check.slot()?;
    let me = layout.slots.len();
    layout.slots.push((slot, parent));
    for child in &check.children {
        field_layout(child, Some(me), depth + 1, limits, layout)?;
    }
    Ok(())
}

/// One field being laid out: its name (for errors) and its child fields.
struct FieldCheck<'f, 'a> {
    field: &'f Field<'a>,
    name: String,
    children: Vec<Field<'a>>,
}

impl FieldCheck<'_, '_> {
    /// The field's type is outside the contract, for `reason`.
    fn unsupported(&self, reason: String) -> WireError {
        WireError::UnsupportedType {
            field: self.name.clone(),
            reason,
        }
    }

    /// The field has `n` child fields.
    fn want_children(&self, n: usize) -> Result<(), WireError> {
        if self.children.len() == n {
            Ok(())
        } else {
            Err(self.unsupported(format!(
                "{:?} needs {n} child field(s), has {}",
                self.field.type_type(),
                self.children.len()
            )))
        }
    }

    /// Add the field, dictionary-encoded, to `layout`: Utf8 values with
    /// signed 8, 16 or 32-bit indexes, its dictionary id not used before.
    fn dictionary_slot(
        &self,
        dictionary: &arrow_ipc::DictionaryEncoding<'_>,
        parent: Option<usize>,
        layout: &mut Layout,
    ) -> Result<(), WireError> {
        let field = self.field;
        let index = dictionary
            .indexType()
            .ok_or_else(|| self.unsupported("a dictionary without an index type".into()))?;
        if !index.is_signed() || !matches!(index.bitWidth(), 8 | 16 | 32) {
            return Err(self.unsupported(format!(
                "dictionary indexes are Int8, Int16 or Int32 (got {}bit{})",
                index.bitWidth(),
                if index.is_signed() { "" } else { " unsigned" }
            )));
        }
        if field.type_type() != Type::Utf8 {
            return Err(self.unsupported(format!(
                "dictionary values are Utf8 (got {:?})",
                field.type_type()
            )));
        }
        self.want_children(0)?;
        let id = dictionary.id();
        if layout.dictionaries.contains(&id) {
            return Err(self.unsupported(format!("dictionary id {id} is used twice")));
        }
        layout.dictionaries.push(id);
        layout.slots.push((
            Slot::Fixed {
                bits: index.bitWidth() as u64,
            },
            parent,
        ));
        Ok(())
    }

    /// The slot of the field's (not dictionary-encoded) type.
    fn slot(&self) -> Result<Slot, WireError> {
        let field = self.field;
        Ok(match field.type_type() {
            Type::Bool => {
                self.want_children(0)?;
                Slot::Fixed { bits: 1 }
            }
            Type::Int => {
                self.want_children(0)?;
                let int = field
                    .type_as_int()
                    .ok_or_else(|| self.unsupported("Int without its parameters".into()))?;
                if !matches!(int.bitWidth(), 8 | 16 | 32 | 64) {
                    return Err(self.unsupported(format!("an integer of {} bits", int.bitWidth())));
                }
                Slot::Fixed {
                    bits: int.bitWidth() as u64,
                }
            }
            Type::FloatingPoint => {
                self.want_children(0)?;
                let float = field.type_as_floating_point().ok_or_else(|| {
                    self.unsupported("FloatingPoint without its parameters".into())
                })?;
                match float.precision() {
                    Precision::SINGLE => Slot::Fixed { bits: 32 },
                    Precision::DOUBLE => Slot::Fixed { bits: 64 },
                    other => {
                        return Err(self.unsupported(format!(
                            "floating point precision {other:?} (Float32 and Float64 only)"
                        )));
                    }
                }
            }
            Type::Utf8 | Type::Binary => {
                self.want_children(0)?;
                Slot::Bytes { width: 4 }
            }
            Type::LargeUtf8 | Type::LargeBinary => {
                self.want_children(0)?;
                Slot::Bytes { width: 8 }
            }
            Type::Date => {
                self.want_children(0)?;
                let date = field
                    .type_as_date()
                    .ok_or_else(|| self.unsupported("Date without its parameters".into()))?;
                if date.unit() != arrow_ipc::DateUnit::DAY {
                    return Err(self.unsupported("dates are Date32 (days)".into()));
                }
                Slot::Fixed { bits: 32 }
            }
            Type::Timestamp => self.timestamp_slot()?,
            Type::List => {
                self.want_children(1)?;
                Slot::List { width: 4 }
            }
            Type::LargeList => {
                self.want_children(1)?;
                Slot::List { width: 8 }
            }
            Type::FixedSizeList => {
                self.want_children(1)?;
                let list = field
                    .type_as_fixed_size_list()
                    .ok_or_else(|| self.unsupported("FixedSizeList without its size".into()))?;
                if list.listSize() <= 0 {
                    return Err(
                        self.unsupported(format!("FixedSizeList of size {}", list.listSize()))
                    );
                }
                Slot::FixedList {
                    size: list.listSize() as u64,
                }
            }
            Type::Struct_ => {
                if self.children.is_empty() {
                    return Err(self.unsupported("a struct without fields".into()));
                }
                Slot::Struct
            }
            other => {
                return Err(
                    self.unsupported(format!("{other:?} is not a type the contract carries"))
                );
            }
        })
    }

    /// The slot of a Timestamp field: any unit, without a zone or in UTC.
    fn timestamp_slot(&self) -> Result<Slot, WireError> {
        self.want_children(0)?;
        let ts = self
            .field
            .type_as_timestamp()
            .ok_or_else(|| self.unsupported("Timestamp without its parameters".into()))?;
        if !matches!(
            ts.unit(),
            arrow_ipc::TimeUnit::SECOND
                | arrow_ipc::TimeUnit::MILLISECOND
                | arrow_ipc::TimeUnit::MICROSECOND
                | arrow_ipc::TimeUnit::NANOSECOND
        ) {
            return Err(self.unsupported(format!("time unit {:?}", ts.unit())));
        }
        if let Some(tz) = ts.timezone()
            && !matches!(tz, "UTC" | "+00:00")
        {
            return Err(self.unsupported(format!(
                "timestamps are without a zone or in UTC, not '{tz}'"
            )));
        }
        Ok(Slot::Fixed { bits: 64 })
    }
}
