//! A request body on its way upstream, which says when the request has gone whole:
//! a transaction id counts then, not at the head. A client that resets its stream
//! before the body ends (hyper's client does so for a request it then reports
//! failed, when a GOAWAY comes between its send and its next readiness check) sent
//! a request no backend can process, and its retry is not a duplicate.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use hyper::body::{Body, Frame, Incoming, SizeHint};

/// Called once, when the request is whole.
pub type OnWhole = Box<dyn FnOnce() + Send + Sync>;

/// The client's body, forwarded as it comes.
pub struct Outbound<B = Incoming> {
    inner: B,
    on_whole: Option<OnWhole>,
}

impl<B: Body + Unpin> Outbound<B> {
    /// `on_whole` runs at once if the head ended the request (a GET, a POST without
    /// a body), else when the body's last frame has been taken.
    pub fn new(inner: B, on_whole: Option<OnWhole>) -> Outbound<B> {
        let mut body = Outbound { inner, on_whole };
        if body.inner.is_end_stream() {
            body.whole();
        }
        body
    }

    fn whole(&mut self) {
        if let Some(on_whole) = self.on_whole.take() {
            on_whole();
        }
    }
}

impl<B: Body + Unpin> Body for Outbound<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            // The sender may stop at `is_end_stream` and never ask for the end.
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.whole(),
            Poll::Ready(None) => self.whole(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty, Full};

    use super::*;

    /// A body that yields `pieces` in turn.
    struct Pieces(std::collections::VecDeque<Result<Frame<Bytes>, &'static str>>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    fn counter() -> (Arc<AtomicU32>, Option<OnWhole>) {
        let n = Arc::new(AtomicU32::new(0));
        let seen = n.clone();
        (
            n,
            Some(Box::new(move || {
                seen.fetch_add(1, Ordering::SeqCst);
            })),
        )
    }

    #[tokio::test]
    async fn a_request_counts_once_its_last_frame_is_taken_and_never_if_it_was_cut() {
        // Ended by its head: counts before anything is sent.
        let (n, on) = counter();
        let _empty = Outbound::new(Empty::<Bytes>::new(), on);
        assert_eq!(n.load(Ordering::SeqCst), 1);

        // A body in one frame: counts when that frame is taken, once.
        let (n, on) = counter();
        let mut body = Outbound::new(Full::new(Bytes::from_static(b"order")), on);
        assert_eq!(n.load(Ordering::SeqCst), 0);
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "order"
        );
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert!(body.frame().await.is_none());
        assert_eq!(n.load(Ordering::SeqCst), 1);

        // A body the client cut after its first piece: never counts.
        let (n, on) = counter();
        let pieces = Pieces(
            [
                Ok(Frame::data(Bytes::from_static(b"ord"))),
                Err("stream reset by the client: CANCEL"),
            ]
            .into(),
        );
        let mut body = Outbound::new(pieces, on);
        assert!(body.frame().await.unwrap().is_ok());
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(n.load(Ordering::SeqCst), 0);
    }
}
