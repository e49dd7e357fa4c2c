//! A plugin that tries to open a TCP connection in `validate`. Its component
//! imports `wasi:sockets`, which the sandbox does not provide: the host must
//! refuse to load it. Not for use.

use lance_context_plugin::*;

pub struct Net;

impl Plugin for Net {
    fn describe(_params: &Params) -> Result<Declaration, InvalidParams> {
        Ok(Declaration::new(
            "hostile-net",
            "0.0.0",
            Schema::new(vec![key_field("id")]),
        ))
    }

    fn validate(_batch: &RecordBatch, _call: &CallInfo, errors: &mut RowErrors) {
        if std::net::TcpStream::connect("127.0.0.1:9").is_ok() {
            errors.push(0, None, "network", "the sandbox let a socket through");
        }
    }
}

#[cfg(target_arch = "wasm32")]
export_plugin!(Net);
