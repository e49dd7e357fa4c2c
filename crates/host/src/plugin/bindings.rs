//! The only module that sees the generated bindings of `wit/plugin.wit`;
//! everything leaving it is a host type.

wasmtime::component::bindgen!({
    world: "schema-plugin",
    path: "../../wit",
});

// The types the world `use`s (SchemaDecl, DescribeError, BatchError,
// CallContext) are generated at this module's root; the rest live here.
pub use lance_context::plugin::types::{Capabilities, Metric};
