//! Framing on the agent's Unix socket:
//!
//! ```text
//! | body length: u32 big-endian | version: u8 | postcard body |
//! ```
//!
//! The length counts the version byte and the body.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{API_VERSION, ApiError};

/// Largest frame accepted (room for a few stripes of file data in later versions).
pub const MAX_FRAME: usize = 64 << 20;

/// Most bytes reserved for a frame before they arrive.
const INITIAL_READ_BUFFER: usize = 16 << 20;

/// The oldest protocol version the agent still serves (its answers are encoded for the
/// version each request came in; see [`read_any_frame`]).
pub const OLDEST_API_VERSION: u8 = 3;

pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), ApiError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    write_frame_as(w, API_VERSION, msg).await
}

/// Writes one frame marked as protocol `version` (the agent answers an older client in
/// the version it spoke).
pub async fn write_frame_as<W, T>(w: &mut W, version: u8, msg: &T) -> Result<(), ApiError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    // Sized first, then encoded once into the frame: a stripe's data is copied once here,
    // not again for every doubling of a growing buffer and once more into the frame.
    let size = postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default())
        .map_err(|e| ApiError::Decode(e.to_string()))?;
    let len = size + 1;
    if len > MAX_FRAME {
        return Err(ApiError::TooLarge(len));
    }
    let mut frame = Vec::with_capacity(len + 4);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    frame.push(version);
    let frame = postcard::to_extend(msg, frame).map_err(|e| ApiError::Decode(e.to_string()))?;
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame of this protocol version; `Ok(None)` on a clean end of stream before a
/// frame starts.
pub async fn read_frame<R, T>(r: &mut R) -> Result<Option<T>, ApiError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    match read_frame_in(r, API_VERSION..=API_VERSION).await? {
        Some((_, msg)) => Ok(Some(msg)),
        None => Ok(None),
    }
}

/// Reads one frame of any version from [`OLDEST_API_VERSION`] to [`API_VERSION`], with its
/// version. Requests only ever gained variants at the end, so every such frame decodes as
/// today's [`crate::Request`].
pub async fn read_any_frame<R, T>(r: &mut R) -> Result<Option<(u8, T)>, ApiError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    read_frame_in(r, OLDEST_API_VERSION..=API_VERSION).await
}

async fn read_frame_in<R, T>(
    r: &mut R,
    versions: std::ops::RangeInclusive<u8>,
) -> Result<Option<(u8, T)>, ApiError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(ApiError::TooLarge(len));
    }
    // Room for a few stripes at once (a 4 MiB read is one allocation, not three); past that
    // the buffer grows with the bytes that arrive, not with the length a peer claims.
    let mut buf = Vec::with_capacity(len.min(INITIAL_READ_BUFFER));
    let got = r.take(len as u64).read_to_end(&mut buf).await?;
    if got < len {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    decode_body(&buf, versions).map(Some)
}

/// A frame's body (after its length): the version byte, then the message.
pub fn decode_body<T: DeserializeOwned>(
    body: &[u8],
    versions: std::ops::RangeInclusive<u8>,
) -> Result<(u8, T), ApiError> {
    let Some((&version, msg)) = body.split_first() else {
        return Err(ApiError::Decode("empty frame".into()));
    };
    if !versions.contains(&version) {
        return Err(ApiError::Version {
            got: version,
            want: API_VERSION,
        });
    }
    postcard::from_bytes(msg)
        .map(|msg| (version, msg))
        .map_err(|e| ApiError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Request;

    #[tokio::test]
    async fn frame_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request::Status)
            .await
            .expect("write");
        let mut r = &buf[..];
        let got: Option<Request> = read_frame(&mut r).await.expect("read");
        assert_eq!(got, Some(Request::Status));
        let end: Option<Request> = read_frame(&mut r).await.expect("eof");
        assert_eq!(end, None);
    }

    #[tokio::test]
    async fn oversized_and_foreign_frames_are_errors() {
        let mut r = &[0xff, 0xff, 0xff, 0xff][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::TooLarge(_))
        ));
        let mut r = &[0, 0, 0, 2, 9, 0][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::Version { got: 9, .. })
        ));
        let mut r = &[0, 0, 0, 2, API_VERSION, 77][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::Decode(_))
        ));
        // The agent takes the previous version too; a client only its own.
        let mut r = &[0, 0, 0, 2, 3, 0][..];
        assert!(matches!(
            read_any_frame::<_, Request>(&mut r).await,
            Ok(Some((3, Request::Status)))
        ));
        let mut r = &[0, 0, 0, 2, 3, 0][..];
        assert!(matches!(
            read_frame::<_, Request>(&mut r).await,
            Err(ApiError::Version { got: 3, .. })
        ));
    }
}
