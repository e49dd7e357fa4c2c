//! The sandbox: what a plugin instance can reach, and what it may use.
//!
//! # The WASI surface
//! Rust's standard library for `wasm32-wasip2` imports a handful of WASI
//! interfaces (stdio, environment, clocks, randomness, streams and polls).
//! The sandbox links exactly those, each implemented here so that **no host
//! function can block or reach the outside world**:
//!
//! | interface | in the sandbox |
//! |---|---|
//! | `wasi:cli/environment` | no variables, no arguments, no working directory |
//! | `wasi:cli/exit` | traps ([`Violation::Exit`]) |
//! | `wasi:cli/stdin` | a closed stream |
//! | `wasi:cli/stdout`, `stderr` | a capture that never refuses a write and keeps the first and last few KiB of each call (a panic's message is the last thing written) |
//! | `wasi:cli/terminal-*` | no terminal |
//! | `wasi:clocks/wall-clock`, `monotonic-clock` | frozen at 0: time does not pass (the host's clock reaches a call as `call-context.now-micros`) |
//! | waiting (`subscribe-*`, `poll`, `block`, blocking stream calls) | answered at once when ready; a wait that would block traps ([`Violation::Blocked`]) |
//! | `wasi:random/*` | the host's entropy, at most 64 KiB per request ([`Violation::RandomTooLarge`]) |
//! | `wasi:filesystem/*`, `wasi:sockets/*`, anything else | not linked: a component importing it does not load |
//!
//! Blocking calls are answered by polling the operation once: every stream
//! here is always ready, so a write or a flush completes, and a sleep (a clock
//! pollable that is not ready) traps instead of parking a host thread where
//! the epoch deadline cannot reach it. Nothing here enters an async runtime,
//! so calls behave the same inside a tokio runtime (the CLI, the server) and
//! outside one.
//!
//! Randomness is real (not a fixed seed): a plugin that mints ids (UUIDv4)
//! gets distinct ones in every call and every instance. Calls are still
//! reproducible in what matters: the clock is the call context's.
//!
//! # Accounting
//! [`HostState`] is also the store's resource limiter: it counts the bytes of
//! *all* linear memories and tables of the instance together against one cap,
//! and caps how many core instances, memories and tables an instance may
//! create (wasmtime's defaults are 10,000 each).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime::{Engine, ResourceLimiter};
use wasmtime_wasi::p2::bindings::sync::io::{poll as sync_poll, streams as sync_streams};
use wasmtime_wasi::p2::bindings::{cli, clocks, random};
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, DynPollable, OutputStream, Pollable, StreamError,
    StreamResult, subscribe,
};
use wasmtime_wasi_io::bindings::wasi::io::streams::{
    Host as AsyncStreams, HostInputStream as AsyncInput, HostOutputStream as AsyncOutput,
};
use wasmtime_wasi_io::bytes::Bytes;

use super::error::Violation;

/// Core instances one component instance may create.
pub(crate) const MAX_CORE_INSTANCES: usize = 32;
/// Linear memories one component instance may create.
pub(crate) const MAX_MEMORIES: usize = 2;
/// Tables one component instance may create.
pub(crate) const MAX_TABLES: usize = 16;
/// Bytes a table element costs (a pointer, in wasmtime).
const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();
/// Largest random request.
const MAX_RANDOM_BYTES: u64 = 64 << 10;
/// Console bytes kept per call: the start and the end of what was written.
const CONSOLE_HEAD: usize = 2 << 10;
const CONSOLE_TAIL: usize = 6 << 10;

/// What one call wrote to stdout and stderr: the first [`CONSOLE_HEAD`] and
/// last [`CONSOLE_TAIL`] bytes, and how many bytes in all. Never refuses a
/// write, never grows past its bound.
#[derive(Debug, Default)]
pub(crate) struct Console {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    total: usize,
}

impl Console {
    fn write(&mut self, bytes: &[u8]) {
        self.total += bytes.len();
        let to_head = (CONSOLE_HEAD - self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..to_head]);
        let rest = &bytes[to_head..];
        let keep = rest.len().min(CONSOLE_TAIL);
        let rest = &rest[rest.len() - keep..];
        let overflow = (self.tail.len() + rest.len()).saturating_sub(CONSOLE_TAIL);
        self.tail.drain(..overflow);
        self.tail.extend(rest);
    }

    /// The captured text (lossy UTF-8; `…` where bytes were dropped).
    pub(crate) fn text(&self) -> String {
        let mut bytes = self.head.clone();
        if self.total > self.head.len() + self.tail.len() {
            bytes.extend_from_slice("\n…\n".as_bytes());
        }
        bytes.extend(self.tail.iter());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The stdout/stderr stream: writes go to the call's [`Console`].
struct ConsoleStream(Arc<Mutex<Console>>);

#[wasmtime_wasi_io::async_trait]
impl OutputStream for ConsoleStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi_io::async_trait]
impl Pollable for ConsoleStream {
    async fn ready(&mut self) {}
}

/// A clock pollable: ready when the wait is zero, never otherwise (time does
/// not pass in the sandbox; polling it once answers "would block").
struct ClockWait {
    ready: bool,
}

#[wasmtime_wasi_io::async_trait]
impl Pollable for ClockWait {
    async fn ready(&mut self) {
        if !self.ready {
            std::future::pending::<()>().await;
        }
    }
}

/// A plugin instance's host side: its resource table, the console capture,
/// the memory accounting, and the violation that stopped it, if any.
pub(crate) struct HostState {
    table: ResourceTable,
    console: Arc<Mutex<Console>>,
    memory_limit: usize,
    /// Bytes of every memory and table of the instance.
    used: usize,
    /// Set when a memory or table growth was refused.
    pub(crate) memory_denied: bool,
    /// Set when the guest did something the sandbox forbids (the trap that
    /// follows is reported as this).
    pub(crate) violation: Option<Violation>,
}

impl std::fmt::Debug for HostState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostState")
            .field("used", &self.used)
            .field("violation", &self.violation)
            .finish_non_exhaustive()
    }
}

impl HostState {
    pub(crate) fn new(memory_limit: usize) -> Self {
        Self {
            table: ResourceTable::new(),
            console: Arc::default(),
            memory_limit,
            used: 0,
            memory_denied: false,
            violation: None,
        }
    }

    /// What the instance wrote to stdout/stderr.
    pub(crate) fn console(&self) -> String {
        self.console
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .text()
    }

    /// Record a violation and return the trap that stops the guest.
    fn stop(&mut self, violation: Violation) -> wasmtime::Error {
        self.violation.get_or_insert(violation);
        wasmtime::format_err!("sandbox: {violation}")
    }

    fn grow(&mut self, current: usize, desired: usize) -> wasmtime::Result<bool> {
        let total = (self.used - current.min(self.used)).saturating_add(desired);
        if total > self.memory_limit {
            self.memory_denied = true;
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes reached",
                self.memory_limit
            ));
        }
        self.used = total;
        Ok(true)
    }

    fn console_stream(&mut self) -> wasmtime::Result<Resource<DynOutputStream>> {
        let stream: DynOutputStream = Box::new(ConsoleStream(self.console.clone()));
        Ok(self.table.push(stream)?)
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(current, desired)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        )
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

/// Poll `f` once: its value when ready, else the guest would block — a trap.
fn once<F: Future>(state_violation: &mut Option<Violation>, f: F) -> wasmtime::Result<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => {
            state_violation.get_or_insert(Violation::Blocked);
            Err(wasmtime::format_err!("sandbox: {}", Violation::Blocked))
        }
    }
}

/// [`once`] for stream calls, whose errors are stream errors.
fn once_stream<T>(
    violation: &mut Option<Violation>,
    f: impl Future<Output = StreamResult<T>>,
) -> StreamResult<T> {
    match once(violation, f) {
        Ok(result) => result,
        Err(trap) => Err(StreamError::Trap(trap)),
    }
}

struct Sandbox;

impl HasData for Sandbox {
    type Data<'a> = &'a mut HostState;
}

struct Table;

impl HasData for Table {
    type Data<'a> = &'a mut ResourceTable;
}

/// The getter every interface's linker entry uses.
fn state(s: &mut HostState) -> &mut HostState {
    s
}

/// A linker with the sandbox's WASI surface and nothing else.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut l = Linker::<HostState>::new(engine);
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<HostState, Table>(&mut l, |s| {
        &mut s.table
    })?;
    sync_poll::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    sync_streams::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::environment::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::exit::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::stdin::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::stdout::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::stderr::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::terminal_input::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::terminal_output::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::terminal_stdin::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::terminal_stdout::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    cli::terminal_stderr::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    clocks::wall_clock::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    clocks::monotonic_clock::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    random::random::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    random::insecure::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    random::insecure_seed::add_to_linker::<HostState, Sandbox>(&mut l, state)?;
    Ok(l)
}

/// Random bytes from the host's entropy.
fn entropy(len: usize) -> wasmtime::Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|e| wasmtime::format_err!("host entropy: {e}"))?;
    Ok(bytes)
}

fn entropy_u64() -> wasmtime::Result<u64> {
    let bytes = entropy(8)?;
    Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
}

// ---- wasi:io/streams and wasi:io/poll, never blocking -------------------------

impl sync_streams::Host for HostState {
    fn convert_stream_error(
        &mut self,
        err: StreamError,
    ) -> wasmtime::Result<sync_streams::StreamError> {
        Ok(
            match AsyncStreams::convert_stream_error(&mut self.table, err)? {
                wasmtime_wasi_io::bindings::wasi::io::streams::StreamError::LastOperationFailed(
                    e,
                ) => sync_streams::StreamError::LastOperationFailed(e),
                wasmtime_wasi_io::bindings::wasi::io::streams::StreamError::Closed => {
                    sync_streams::StreamError::Closed
                }
            },
        )
    }
}

impl sync_streams::HostOutputStream for HostState {
    fn drop(&mut self, stream: Resource<DynOutputStream>) -> wasmtime::Result<()> {
        once(
            &mut self.violation,
            AsyncOutput::drop(&mut self.table, stream),
        )?
    }

    fn check_write(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<u64> {
        AsyncOutput::check_write(&mut self.table, stream)
    }

    fn write(&mut self, stream: Resource<DynOutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
        AsyncOutput::write(&mut self.table, stream, bytes)
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        once_stream(
            &mut self.violation,
            AsyncOutput::blocking_write_and_flush(&mut self.table, stream, bytes),
        )
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        once_stream(
            &mut self.violation,
            AsyncOutput::blocking_write_zeroes_and_flush(&mut self.table, stream, len),
        )
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        AsyncOutput::subscribe(&mut self.table, stream)
    }

    fn write_zeroes(&mut self, stream: Resource<DynOutputStream>, len: u64) -> StreamResult<()> {
        AsyncOutput::write_zeroes(&mut self.table, stream, len)
    }

    fn flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        AsyncOutput::flush(&mut self.table, stream)
    }

    fn blocking_flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        once_stream(
            &mut self.violation,
            AsyncOutput::blocking_flush(&mut self.table, stream),
        )
    }

    fn splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        AsyncOutput::splice(&mut self.table, dst, src, len)
    }

    fn blocking_splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        once_stream(
            &mut self.violation,
            AsyncOutput::blocking_splice(&mut self.table, dst, src, len),
        )
    }
}

impl sync_streams::HostInputStream for HostState {
    fn drop(&mut self, stream: Resource<DynInputStream>) -> wasmtime::Result<()> {
        once(
            &mut self.violation,
            AsyncInput::drop(&mut self.table, stream),
        )?
    }

    fn read(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<Vec<u8>> {
        AsyncInput::read(&mut self.table, stream, len)
    }

    fn blocking_read(
        &mut self,
        stream: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<Vec<u8>> {
        once_stream(
            &mut self.violation,
            AsyncInput::blocking_read(&mut self.table, stream, len),
        )
    }

    fn skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        AsyncInput::skip(&mut self.table, stream, len)
    }

    fn blocking_skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        once_stream(
            &mut self.violation,
            AsyncInput::blocking_skip(&mut self.table, stream, len),
        )
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynInputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        AsyncInput::subscribe(&mut self.table, stream)
    }
}

impl sync_poll::Host for HostState {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        use wasmtime_wasi_io::bindings::wasi::io::poll::Host as AsyncPoll;
        once(
            &mut self.violation,
            AsyncPoll::poll(&mut self.table, pollables),
        )?
    }
}

impl sync_poll::HostPollable for HostState {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        use wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable as AsyncPollable;
        once(
            &mut self.violation,
            AsyncPollable::ready(&mut self.table, pollable),
        )?
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        use wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable as AsyncPollable;
        once(
            &mut self.violation,
            AsyncPollable::block(&mut self.table, pollable),
        )?
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        use wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable as AsyncPollable;
        AsyncPollable::drop(&mut self.table, pollable)
    }
}

// ---- wasi:cli ------------------------------------------------------------------

impl cli::environment::Host for HostState {
    fn get_environment(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }
    fn get_arguments(&mut self) -> wasmtime::Result<Vec<String>> {
        Ok(Vec::new())
    }
    fn initial_cwd(&mut self) -> wasmtime::Result<Option<String>> {
        Ok(None)
    }
}

impl cli::exit::Host for HostState {
    fn exit(&mut self, _status: Result<(), ()>) -> wasmtime::Result<()> {
        Err(self.stop(Violation::Exit))
    }
    fn exit_with_code(&mut self, _status_code: u8) -> wasmtime::Result<()> {
        Err(self.stop(Violation::Exit))
    }
}

impl cli::stdin::Host for HostState {
    fn get_stdin(&mut self) -> wasmtime::Result<Resource<DynInputStream>> {
        let stream: DynInputStream = Box::new(wasmtime_wasi::p2::pipe::ClosedInputStream);
        Ok(self.table.push(stream)?)
    }
}

impl cli::stdout::Host for HostState {
    fn get_stdout(&mut self) -> wasmtime::Result<Resource<DynOutputStream>> {
        self.console_stream()
    }
}

impl cli::stderr::Host for HostState {
    fn get_stderr(&mut self) -> wasmtime::Result<Resource<DynOutputStream>> {
        self.console_stream()
    }
}

impl cli::terminal_input::Host for HostState {}
impl cli::terminal_input::HostTerminalInput for HostState {
    fn drop(&mut self, rep: Resource<cli::terminal_input::TerminalInput>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}
impl cli::terminal_output::Host for HostState {}
impl cli::terminal_output::HostTerminalOutput for HostState {
    fn drop(
        &mut self,
        rep: Resource<cli::terminal_output::TerminalOutput>,
    ) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}
impl cli::terminal_stdin::Host for HostState {
    fn get_terminal_stdin(
        &mut self,
    ) -> wasmtime::Result<Option<Resource<cli::terminal_input::TerminalInput>>> {
        Ok(None)
    }
}
impl cli::terminal_stdout::Host for HostState {
    fn get_terminal_stdout(
        &mut self,
    ) -> wasmtime::Result<Option<Resource<cli::terminal_output::TerminalOutput>>> {
        Ok(None)
    }
}
impl cli::terminal_stderr::Host for HostState {
    fn get_terminal_stderr(
        &mut self,
    ) -> wasmtime::Result<Option<Resource<cli::terminal_output::TerminalOutput>>> {
        Ok(None)
    }
}

// ---- wasi:clocks -----------------------------------------------------------------

impl clocks::wall_clock::Host for HostState {
    fn now(&mut self) -> wasmtime::Result<clocks::wall_clock::Datetime> {
        Ok(clocks::wall_clock::Datetime {
            seconds: 0,
            nanoseconds: 0,
        })
    }
    fn resolution(&mut self) -> wasmtime::Result<clocks::wall_clock::Datetime> {
        Ok(clocks::wall_clock::Datetime {
            seconds: 1,
            nanoseconds: 0,
        })
    }
}

impl HostState {
    fn clock_wait(&mut self, ready: bool) -> wasmtime::Result<Resource<DynPollable>> {
        let wait = self.table.push(ClockWait { ready })?;
        subscribe(&mut self.table, wait)
    }
}

impl clocks::monotonic_clock::Host for HostState {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(0)
    }
    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1_000_000_000)
    }
    fn subscribe_instant(&mut self, when: u64) -> wasmtime::Result<Resource<DynPollable>> {
        // The clock stands at 0: only an instant at 0 has come.
        self.clock_wait(when == 0)
    }
    fn subscribe_duration(&mut self, duration: u64) -> wasmtime::Result<Resource<DynPollable>> {
        self.clock_wait(duration == 0)
    }
}

// ---- wasi:random -----------------------------------------------------------------

impl HostState {
    fn random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        if len > MAX_RANDOM_BYTES {
            return Err(self.stop(Violation::RandomTooLarge));
        }
        entropy(len as usize)
    }
}

impl random::random::Host for HostState {
    fn get_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.random_bytes(len)
    }
    fn get_random_u64(&mut self) -> wasmtime::Result<u64> {
        entropy_u64()
    }
}

impl random::insecure::Host for HostState {
    fn get_insecure_random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        self.random_bytes(len)
    }
    fn get_insecure_random_u64(&mut self) -> wasmtime::Result<u64> {
        entropy_u64()
    }
}

impl random::insecure_seed::Host for HostState {
    fn insecure_seed(&mut self) -> wasmtime::Result<(u64, u64)> {
        Ok((entropy_u64()?, entropy_u64()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_keeps_the_head_and_tail_within_its_bound() {
        let mut c = Console::default();
        c.write(b"start ");
        for _ in 0..10_000 {
            c.write(&[b'x'; 100]);
        }
        c.write(b" panicked at the end");
        let text = c.text();
        assert!(text.starts_with("start "), "{}", &text[..20]);
        assert!(text.ends_with(" panicked at the end"));
        assert!(
            text.len() <= CONSOLE_HEAD + CONSOLE_TAIL + 8,
            "{}",
            text.len()
        );
        assert_eq!(c.total, 6 + 1_000_000 + 20);
    }

    #[test]
    fn a_ready_wait_completes_and_a_sleep_is_a_violation() {
        let mut violation = None;
        assert!(once(&mut violation, async { 1 }).is_ok());
        assert_eq!(violation, None);
        assert!(once(&mut violation, std::future::pending::<()>()).is_err());
        assert_eq!(violation, Some(Violation::Blocked));
    }
}
