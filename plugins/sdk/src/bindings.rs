//! The component glue: bindings generated from `wit/plugin.wit` and the
//! conversions between them and the SDK's types. Used by [`crate::export_plugin!`].

wit_bindgen::generate!({
    world: "schema-plugin",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "__export_schema_plugin",
    default_bindings_module: "lance_context_plugin::bindings",
});

use crate::{CallError, Declaration, Metric, Plugin, RowError, ipc};
use lance_context::plugin::types;

// `Guest` and the types the world `use`s (SchemaDecl, DescribeError,
// BatchError, CallContext, …) are generated at this module's root.

fn row_error(e: RowError) -> types::RowError {
    types::RowError {
        row: e.row,
        column: e.column,
        code: e.code,
        message: e.message,
    }
}

fn batch_error(e: CallError) -> BatchError {
    match e {
        CallError::Rows(rows) => BatchError::Rows(rows.into_iter().map(row_error).collect()),
        CallError::Malformed(message) => BatchError::MalformedInput(message),
    }
}

fn declaration(d: Declaration) -> Result<SchemaDecl, DescribeError> {
    let arrow_schema =
        ipc::encode_schema(&d.schema).map_err(|e| DescribeError::InvalidParams(e.to_string()))?;
    let mut capabilities = types::Capabilities::empty();
    if d.capabilities.tombstones {
        capabilities |= types::Capabilities::TOMBSTONES;
    }
    if d.capabilities.supersession {
        capabilities |= types::Capabilities::SUPERSESSION;
    }
    if d.capabilities.lifecycle {
        capabilities |= types::Capabilities::LIFECYCLE;
    }
    if d.capabilities.unique_keys {
        capabilities |= types::Capabilities::UNIQUE_KEYS;
    }
    Ok(SchemaDecl {
        name: d.name,
        version: d.version,
        abi_version: crate::ABI_VERSION,
        arrow_schema,
        key_column: d.key_column,
        blob_columns: d.blob_columns,
        vector_columns: d
            .vector_columns
            .into_iter()
            .map(|v| types::VectorColumn {
                name: v.name,
                dimension: v.dimension,
                metric: match v.metric {
                    Metric::L2 => types::Metric::L2,
                    Metric::Cosine => types::Metric::Cosine,
                    Metric::Dot => types::Metric::Dot,
                },
            })
            .collect(),
        secondary_key: d.secondary_key,
        capabilities,
        has_transform: d.has_transform,
        queries: d
            .queries
            .into_iter()
            .map(|q| types::NamedQuery {
                name: q.name,
                description: q.description,
                params: q.params,
                filter: q.filter,
                order_by: q.order_by,
                reduce: q.reduce,
            })
            .collect(),
    })
}

#[doc(hidden)]
pub fn describe<P: Plugin>(params: &[(String, String)]) -> Result<SchemaDecl, DescribeError> {
    declaration(P::describe(params).map_err(|e| DescribeError::InvalidParams(e.to_string()))?)
}

#[doc(hidden)]
pub fn describe_text<P: Plugin>(
    params: &[(String, String)],
) -> Result<Vec<types::TextColumn>, DescribeError> {
    let d = P::describe(params).map_err(|e| DescribeError::InvalidParams(e.to_string()))?;
    Ok(d.text_columns
        .into_iter()
        .map(|t| types::TextColumn {
            name: t.name,
            tokenizer: t.tokenizer,
            language: t.language,
            lower_case: t.lower_case,
            stem: t.stem,
            remove_stop_words: t.remove_stop_words,
            ascii_folding: t.ascii_folding,
            max_token_length: t.max_token_length,
        })
        .collect())
}

#[doc(hidden)]
pub fn validate<P: Plugin>(batch: Vec<u8>, context: CallContext) -> Result<(), BatchError> {
    let call = crate::CallInfo {
        now_micros: context.now_micros,
        params: context.params,
    };
    crate::run_validate::<P>(batch, &call).map_err(batch_error)
}

#[doc(hidden)]
pub fn transform<P: Plugin>(batch: Vec<u8>, context: CallContext) -> Result<Vec<u8>, BatchError> {
    let call = crate::CallInfo {
        now_micros: context.now_micros,
        params: context.params,
    };
    crate::run_transform::<P>(batch, &call).map_err(batch_error)
}

#[doc(hidden)]
pub fn reduce<P: Plugin>(
    query: String,
    batch: Vec<u8>,
    context: CallContext,
) -> Result<String, BatchError> {
    let call = crate::CallInfo {
        now_micros: context.now_micros,
        params: context.params,
    };
    crate::run_reduce::<P>(&query, batch, &call).map_err(batch_error)
}

/// Export a [`Plugin`] as the component's `schema-plugin` world.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        struct __LanceContextExport;
        impl $crate::bindings::Guest for __LanceContextExport {
            fn describe(
                params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::std::result::Result<$crate::bindings::SchemaDecl, $crate::bindings::DescribeError>
            {
                $crate::bindings::describe::<$plugin>(&params)
            }
            fn describe_text(
                params: ::std::vec::Vec<(::std::string::String, ::std::string::String)>,
            ) -> ::std::result::Result<
                ::std::vec::Vec<$crate::bindings::TextColumn>,
                $crate::bindings::DescribeError,
            > {
                $crate::bindings::describe_text::<$plugin>(&params)
            }
            fn validate(
                batch: ::std::vec::Vec<u8>,
                context: $crate::bindings::CallContext,
            ) -> ::std::result::Result<(), $crate::bindings::BatchError> {
                $crate::bindings::validate::<$plugin>(batch, context)
            }
            fn transform(
                batch: ::std::vec::Vec<u8>,
                context: $crate::bindings::CallContext,
            ) -> ::std::result::Result<::std::vec::Vec<u8>, $crate::bindings::BatchError> {
                $crate::bindings::transform::<$plugin>(batch, context)
            }
            fn reduce(
                query: ::std::string::String,
                batch: ::std::vec::Vec<u8>,
                context: $crate::bindings::CallContext,
            ) -> ::std::result::Result<::std::string::String, $crate::bindings::BatchError> {
                $crate::bindings::reduce::<$plugin>(query, batch, context)
            }
        }
        $crate::bindings::__export_schema_plugin!(__LanceContextExport with_types_in $crate::bindings);
    };
}
