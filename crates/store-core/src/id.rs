//! Ids minted by the engine.

/// A fresh UUIDv7 in its hyphenated 36-character form.
///
/// Version 7 ids sort by creation time, which keeps append-heavy tables and their
/// key indexes local. This is the one place the engine mints ids.
pub fn generate_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

/// The MemWAL shard of an instance: a UUIDv5 of its instance id, so the same
/// instance id always writes through the same shard, on any machine.
pub fn shard_id_for_instance(instance_id: &str) -> uuid::Uuid {
    uuid::Uuid::new_v5(&SHARD_NAMESPACE, instance_id.as_bytes())
}

/// Namespace of shard ids (a fixed, random UUID owned by this project).
const SHARD_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6c61_6e63_652d_4c43_8000_7368_6172_6421);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_v7_and_ordered() {
        let a = generate_id();
        let b = generate_id();
        assert_eq!(a.len(), 36);
        let parsed = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 7);
        assert!(a < b, "v7 ids minted in order sort in order: {a} {b}");
    }

    #[test]
    fn shard_ids_are_stable_per_instance() {
        assert_eq!(
            shard_id_for_instance("default"),
            shard_id_for_instance("default")
        );
        assert_ne!(shard_id_for_instance("default"), shard_id_for_instance("b"));
    }
}
