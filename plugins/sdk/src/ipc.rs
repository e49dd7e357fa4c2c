//! Arrow IPC in and out. Decoding uses the bounded `StreamDecoder` over one
//! buffer, so corrupt length prefixes give an error instead of a huge
//! allocation; it takes the bytes by value and decodes in place (the arrays
//! point into them, nothing is copied). Encoding sizes its output once and
//! pads buffers to 8 bytes.

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::MetadataVersion;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::Schema;

/// Decode an Arrow IPC stream into its batches, without copying the bytes.
pub fn decode(bytes: Vec<u8>) -> Result<Vec<RecordBatch>, String> {
    let mut decoder = StreamDecoder::new();
    let mut buffer = Buffer::from_vec(bytes);
    let mut batches = Vec::new();
    while !buffer.is_empty() {
        match decoder.decode(&mut buffer) {
            Ok(Some(batch)) => batches.push(batch),
            Ok(None) => {}
            Err(e) => return Err(format!("invalid Arrow IPC stream: {e}")),
        }
    }
    decoder
        .finish()
        .map_err(|e| format!("truncated Arrow IPC stream: {e}"))?;
    Ok(batches)
}

/// Encode batches (all of one schema) as an Arrow IPC stream.
pub fn encode(batches: &[RecordBatch]) -> Result<Vec<u8>, String> {
    let Some(first) = batches.first() else {
        return Err("nothing to encode".to_string());
    };
    // Buffers plus padding and per-message metadata: one allocation, no regrowth.
    let size: usize = batches
        .iter()
        .map(|b| b.get_array_memory_size() + 64 * b.num_columns() + 1024)
        .sum();
    let mut out = Vec::with_capacity(size);
    let mut writer = StreamWriter::try_new_with_options(&mut out, &first.schema(), options())
        .map_err(|e| format!("encoding Arrow IPC: {e}"))?;
    for batch in batches {
        writer
            .write(batch)
            .map_err(|e| format!("encoding Arrow IPC: {e}"))?;
    }
    writer
        .finish()
        .map_err(|e| format!("encoding Arrow IPC: {e}"))?;
    drop(writer);
    Ok(out)
}

fn options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(8, false, MetadataVersion::V5).expect("8 is a valid alignment")
}

/// Encode a schema alone (the declaration's `arrow-schema`).
pub fn encode_schema(schema: &Schema) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut writer =
        StreamWriter::try_new(&mut out, schema).map_err(|e| format!("encoding schema: {e}"))?;
    writer
        .finish()
        .map_err(|e| format!("encoding schema: {e}"))?;
    drop(writer);
    Ok(out)
}

/// Decode a schema-only stream.
pub fn decode_schema(bytes: &[u8]) -> Result<Schema, String> {
    let mut decoder = StreamDecoder::new();
    let mut buffer = Buffer::from(bytes);
    while !buffer.is_empty() {
        if let Err(e) = decoder.decode(&mut buffer) {
            return Err(format!("invalid Arrow IPC schema: {e}"));
        }
    }
    decoder
        .schema()
        .map(|s| s.as_ref().clone())
        .ok_or_else(|| "the stream holds no schema".to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field};

    use super::*;

    #[test]
    fn batches_and_schemas_round_trip() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("n", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Int64Array::from(vec![Some(1), None])),
            ],
        )
        .unwrap();
        let bytes = encode(&[batch.clone(), batch.clone()]).unwrap();
        let back = decode(bytes).unwrap();
        assert_eq!(back, vec![batch.clone(), batch]);
        let schema_bytes = encode_schema(&schema).unwrap();
        assert_eq!(decode_schema(&schema_bytes).unwrap(), *schema);
    }

    #[test]
    fn garbage_is_an_error_not_an_allocation() {
        let mut bytes = vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        bytes.extend_from_slice(&[1, 2, 3]);
        assert!(decode(bytes).is_err());
        assert!(decode(vec![1, 2, 3]).is_err());
    }
}
