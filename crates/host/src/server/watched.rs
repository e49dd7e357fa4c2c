//! A connection's socket and response bodies as the connection's deadlines
//! see them ([`Watched`], [`Tracked`]), and the JSON body of the answers
//! hyper writes itself.
//!
//! hyper answers a request head it refuses — 400 (does not parse), 414 (a
//! URI over 65,534 bytes), 431 (a head over its buffer, or over 100 header
//! fields) — before any service runs, with an empty body and no hook to set
//! one. The socket wrapper recognises that answer on its way out and writes
//! the API's JSON error in its place. It is recognisable: it is written
//! while no request is being served, alone, a 4xx head with
//! `content-length: 0`, and the router never answers an error without a
//! JSON body (the `json_errors` middleware).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::http::StatusCode;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::connections::{Activity, MAX_BUFFERED_HEAD, Serving};
use super::error::ApiError;

/// A connection's socket: reads mark the start of a head; hyper's own
/// error answers get a JSON body.
#[derive(Debug)]
pub(crate) struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
    /// The answer written instead of hyper's, and how much of it is written.
    answer: Option<(Vec<u8>, usize)>,
}

impl Watched {
    pub(crate) fn new(inner: TcpStream, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            answer: None,
        }
    }

    /// Write what is left of the replacement answer.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.answer
            && *written < bytes.len()
        {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.received();
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.answer.is_none()
            && !this.activity.serving()
            && let Some(answer) = json_answer(buf)
        {
            this.answer = Some((answer, 0));
        }
        if this.answer.is_some() {
            // hyper's bytes count as written; ours go out instead (hyper
            // closes the connection after this answer).
            ready!(this.poll_answer(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // An error head is looked at whole (an error answer is small).
        let error_head = bufs
            .iter()
            .find(|b| !b.is_empty())
            .is_some_and(|b| b.starts_with(b"HTTP/1.1 4"));
        if this.answer.is_some() || error_head {
            let mut whole = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
            for b in bufs {
                whole.extend_from_slice(b);
            }
            return Pin::new(this).poll_write(cx, &whole);
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_answer(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_answer(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// hyper's own answer to a refused head, with the API's JSON error body;
/// `None` for anything else.
fn json_answer(written: &[u8]) -> Option<Vec<u8>> {
    const EMPTY: &str = "\r\ncontent-length: 0\r\n";
    // hyper's answer is a short 4xx head; most writes are ruled out here.
    if written.len() > 1024 || !written.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let text = std::str::from_utf8(written).ok()?;
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    // Exactly one head without a body.
    let end = text.find("\r\n\r\n")?;
    if end + 4 != text.len() || !text[..end + 2].contains(EMPTY) {
        return None;
    }
    let error = match status {
        "400" => ApiError::invalid("the request line or a header does not parse"),
        "414" => ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            "the URI exceeds 65534 bytes",
        ),
        "431" => ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request head exceeds {MAX_BUFFERED_HEAD} bytes or 100 header fields"),
        ),
        _ => return None,
    };
    let body = error.to_json();
    let head = text[..end + 2].replacen(
        EMPTY,
        &format!(
            "\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ),
        1,
    );
    Some([head.as_bytes(), b"\r\n", &body].concat())
}

/// A response body that ends its request's [`Serving`] when hyper drops
/// it (its last bytes are then written or buffered).
#[derive(Debug)]
pub(crate) struct Tracked<B> {
    body: B,
    _serving: Serving,
}

impl<B> Tracked<B> {
    pub(crate) fn new(body: B, serving: Serving) -> Self {
        Self {
            body,
            _serving: serving,
        }
    }
}

impl<B: HttpBody + Unpin> HttpBody for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
