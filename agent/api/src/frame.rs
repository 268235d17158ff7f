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

pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), ApiError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = postcard::to_allocvec(msg).map_err(|e| ApiError::Decode(e.to_string()))?;
    let len = body.len() + 1;
    if len > MAX_FRAME {
        return Err(ApiError::TooLarge(len));
    }
    let mut frame = Vec::with_capacity(len + 4);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    frame.push(API_VERSION);
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame; `Ok(None)` on a clean end of stream before a frame starts.
pub async fn read_frame<R, T>(r: &mut R) -> Result<Option<T>, ApiError>
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
    // Grow with the bytes that arrive, not with the length a peer claims.
    let mut buf = Vec::with_capacity(len.min(1 << 20));
    let got = r.take(len as u64).read_to_end(&mut buf).await?;
    if got < len {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    if buf[0] != API_VERSION {
        return Err(ApiError::Version {
            got: buf[0],
            want: API_VERSION,
        });
    }
    postcard::from_bytes(&buf[1..])
        .map(Some)
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
    }
}
