//! The one tower layer on every gRPC server (`Server::builder()
//! .layer(ServerLayer)`): it times and counts each call ([`crate::rpc`])
//! and gives it its place in a trace ([`crate::trace::grpc`]), so no
//! handler carries telemetry code. With neither metrics nor traces on, a
//! call goes straight through.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower::{Layer, Service};

use crate::rpc::Timing;
use crate::trace::grpc::CallTrace;

#[derive(Clone, Copy, Debug, Default)]
pub struct ServerLayer;

impl<S> Layer<S> for ServerLayer {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        crate::rpc::register();
        Observed { inner }
    }
}

#[derive(Clone, Debug)]
pub struct Observed<S> {
    inner: S,
}

impl<S, B, R> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let timing = Timing::start(request.uri().path());
        let trace = CallTrace::of(request.headers(), request.uri().path());
        if timing.is_none() && trace.is_none() {
            return Box::pin(self.inner.call(request));
        }
        let call = trace.enter(|| self.inner.call(request));
        let timed = async move {
            let response = call.await;
            if let Some(timing) = timing {
                timing.finish(response.as_ref().ok().map(|r| r.headers()));
            }
            response
        };
        trace.run(timed)
    }
}
