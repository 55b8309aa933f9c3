//! The codec of every cellmesh gRPC service: prost, except that a message
//! that does not decode is bad input — answered `INVALID_ARGUMENT` with reason
//! `MALFORMED_REQUEST` and the decoder's explanation — rather than the
//! `INTERNAL` a plain prost codec reports.

use crate::reason::Reason;
use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

use crate::status::to_status;
use crate::v1::ErrorCode;

pub struct CellmeshCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for CellmeshCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for CellmeshCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(ProstDecoder::new(BufferSettings::default()))
    }
}

/// prost's decoder with decode failures reported as bad input.
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            to_status(
                ErrorCode::InvalidArgument,
                Reason::MalformedRequest,
                status.message().to_string(),
                0,
                None,
            )
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
