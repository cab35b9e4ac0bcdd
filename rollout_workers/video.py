"""Episode frames to an H.264 MP4 that browsers play, in memory (the evaluation actor returns the
bytes; the driver writes the file into the run folder).

imageio-ffmpeg, not PyAV: it ships its own ffmpeg build and encodes in that process, beside the
evaluator rather than on its GIL, and measured faster here (docs/benchmarks.md, "Evaluation":
3.4 against 5.7 s per 1,000 CartPole frames, 0.76 against 1.45 s per 1,000 Breakout frames). yuv420p and
`+faststart` (the index first) are what browsers need to start and seek before the whole file is in.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np


class VideoError(RuntimeError):
    """The encoder is missing or failed (one line)."""


def even(frame: np.ndarray) -> np.ndarray:
    """[H, W, 3] padded by edge pixels to even sides: yuv420p halves both."""
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def encode_mp4(frames: Sequence[np.ndarray], fps: float, metadata: Mapping[str, str]) -> bytes:
    """The MP4 of `frames` (uint8 RGB [H, W, 3], one size) at `fps`, with `metadata` in its
    container (title, comment...)."""
    try:
        import imageio_ffmpeg
    except ImportError as err:
        missing = f"videos need the video extra ({err.name} is missing)"
        raise VideoError(f"{missing}: pip install 'relay-rl[video]'") from None
    if not frames:
        raise VideoError("no frames to encode")
    first = even(frames[0])
    h, w = first.shape[:2]
    meta = [arg for k, v in metadata.items() for arg in ("-metadata", f"{k}={v}")]
    fd, path = tempfile.mkstemp(suffix=".mp4", prefix="relay-video-")
    os.close(fd)
    try:
        writer = imageio_ffmpeg.write_frames(
            path,
            (w, h),
            fps=max(float(fps), 1.0),
            codec="libx264",
            pix_fmt_out="yuv420p",
            macro_block_size=1,  # padded to even sides above; no rescaling
            output_params=["-movflags", "+faststart", *meta],
            ffmpeg_log_level="error",
        )
        writer.send(None)
        for frame in frames:
            writer.send(np.ascontiguousarray(even(frame)))
        writer.close()
        with open(path, "rb") as f:
            return f.read()
    except (OSError, RuntimeError, StopIteration) as err:
        raise VideoError(f"encoding the video failed ({' '.join(str(err).split())[:200]})") from None
    finally:
        os.unlink(path)


def video_stem(label: str, episode_return: float) -> str:
    """`<label>-return-487`: the return rounded, `m` for a minus sign (names that sort and read)."""
    r = round(episode_return)
    return f"{label}-return-{'m' if r < 0 else ''}{abs(r)}"
