//! Writes gathered into fewer system calls. HTTP/2 writes and flushes
//! after every frame its connection task finds ready, and that task is
//! woken by each stream that queues one: a cell pushing to thousands of
//! device streams over a few shared connections made one `writev` per
//! push. [`Coalesced`] buffers what is written, and the first flush of a
//! buffer yields once (the task is woken again at the back of the run
//! queue) so that the other streams woken by the same event queue their
//! frames before the buffer goes out in one write. Nothing waits on a
//! timer: an idle runtime polls the task again at once, and a full buffer
//! is written without yielding.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A flush with this much buffered writes at once instead of yielding, and
/// a write this large with nothing buffered goes straight through.
const FLUSH_AT: usize = 16 * 1024;
/// Buffered bytes at most: a write that would pass this drains the buffer
/// first.
const CAPACITY: usize = 4 * FLUSH_AT;

/// An I/O object whose writes are buffered and whose flushes yield once.
/// The buffer grows with what is written and is given back after a burst
/// larger than [`FLUSH_AT`]: an edge holds many idle device connections.
pub struct Coalesced<T> {
    io: T,
    buf: Vec<u8>,
    /// How much of `buf` has been written out already.
    written: usize,
    /// This buffer's flush has yielded already: the next one writes.
    yielded: bool,
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    pub fn new(io: T) -> Self {
        Self {
            io,
            buf: Vec::new(),
            written: 0,
            yielded: false,
        }
    }

    /// Writes out everything buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.written = 0;
        if self.buf.capacity() > FLUSH_AT {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes: `Ready(true)` when they are to be
    /// buffered, `Ready(false)` when they go straight to the connection.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<std::io::Result<bool>> {
        if self.buf.len() + len > CAPACITY {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(!(self.buf.is_empty() && len >= FLUSH_AT)))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if ready!(this.poll_room(cx, data.len()))? {
            this.buf.extend_from_slice(data);
            Poll::Ready(Ok(data.len()))
        } else {
            Pin::new(&mut this.io).poll_write(cx, data)
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        if ready!(this.poll_room(cx, len))? {
            for b in bufs {
                this.buf.extend_from_slice(b);
            }
            Poll::Ready(Ok(len))
        } else {
            Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let buffered = this.buf.len() - this.written;
        if buffered > 0 && buffered < FLUSH_AT && !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        this.yielded = false;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    use tokio::io::{AsyncWrite, AsyncWriteExt};

    use super::{Coalesced, FLUSH_AT};

    /// Records each write it is given.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.0.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn poll_flush(io: &mut Coalesced<Writes>) -> Poll<std::io::Result<()>> {
        Pin::new(io).poll_flush(&mut Context::from_waker(Waker::noop()))
    }

    fn poll_write(io: &mut Coalesced<Writes>, bytes: &[u8]) {
        let written = Pin::new(io).poll_write(&mut Context::from_waker(Waker::noop()), bytes);
        assert!(matches!(written, Poll::Ready(Ok(n)) if n == bytes.len()));
    }

    #[test]
    fn frames_flushed_one_by_one_go_out_in_one_write() {
        let writes = Writes::default();
        let mut io = Coalesced::new(writes.clone());
        poll_write(&mut io, b"first");
        // The first flush yields; what is written before the next one
        // joins the same write.
        assert!(poll_flush(&mut io).is_pending());
        assert!(writes.0.lock().unwrap().is_empty());
        poll_write(&mut io, b"second");
        assert!(poll_flush(&mut io).is_ready());
        assert_eq!(*writes.0.lock().unwrap(), vec![b"firstsecond".to_vec()]);
        // Nothing buffered: a flush is done at once; the next buffer
        // yields again.
        assert!(poll_flush(&mut io).is_ready());
        poll_write(&mut io, b"third");
        assert!(poll_flush(&mut io).is_pending());
        assert!(poll_flush(&mut io).is_ready());
        assert_eq!(writes.0.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_large_write_goes_straight_through_and_a_burst_gives_its_buffer_back() {
        let writes = Writes::default();
        let mut io = Coalesced::new(writes.clone());
        poll_write(&mut io, &vec![1u8; 4 * FLUSH_AT]);
        assert_eq!(writes.0.lock().unwrap().len(), 1);
        assert_eq!(io.buf.capacity(), 0);
        for _ in 0..3 {
            poll_write(&mut io, &vec![2u8; FLUSH_AT - 1]);
        }
        assert!(poll_flush(&mut io).is_ready());
        assert_eq!(
            writes.0.lock().unwrap().concat().len(),
            4 * FLUSH_AT + 3 * (FLUSH_AT - 1)
        );
        assert_eq!(io.buf.capacity(), 0, "the burst's buffer is kept");
    }

    #[test]
    fn a_full_buffer_is_written_without_yielding() {
        let writes = Writes::default();
        let mut io = Coalesced::new(writes.clone());
        poll_write(&mut io, &vec![7u8; FLUSH_AT]);
        assert!(poll_flush(&mut io).is_ready());
        assert_eq!(writes.0.lock().unwrap().concat().len(), FLUSH_AT);
    }

    #[tokio::test]
    async fn flushed_bytes_reach_the_peer_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut peer, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut peer, &mut got)
                .await
                .unwrap();
            got
        });
        let mut io = Coalesced::new(tokio::net::TcpStream::connect(address).await.unwrap());
        let mut sent = Vec::new();
        for i in 0..2_000u32 {
            let frame = format!("frame {i};").into_bytes();
            io.write_all(&frame).await.unwrap();
            io.flush().await.unwrap();
            sent.extend_from_slice(&frame);
        }
        io.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), sent);
    }
}
