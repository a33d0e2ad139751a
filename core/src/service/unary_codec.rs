//! A prost codec for small unary calls.
//!
//! tonic's default codec buffers are 8 KiB per call in each direction. An
//! `UpdateNodeStatus` or `Heartbeat` message is a few hundred bytes, and
//! an 8 KiB allocation per message is served from glibc's large-chunk path
//! (which consolidates its fast bins; `malloc_consolidate` showed up under
//! the encode path in a profile of `metropolis-load update-tls`). The
//! buffers here start small and grow when a message needs it. The effect
//! on throughput was within the benchmark's run-to-run noise.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Initial buffer size of each direction.
const BUFFER_SIZE: usize = 512;

/// tonic's default: how much an encoder buffers before yielding.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// A [`Codec`] encoding `T` and decoding `U` with [`BUFFER_SIZE`] buffers.
#[derive(Debug)]
pub(crate) struct UnaryCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for UnaryCodec<T, U> {
    fn default() -> Self {
        UnaryCodec(PhantomData)
    }
}

impl<T, U> Codec for UnaryCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }
}
