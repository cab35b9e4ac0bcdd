"""Chat templates rendered in a child process with a time, memory and length budget.

A chat template is a Jinja program that ships in a model folder a user downloaded. Jinja's sandbox
keeps it from Python's internals and caps `range` at 100,000 items, but bounds neither its time
(nested loops: 10^10 steps) nor its memory (`{{ 'x' * 200000000 }}`, folded into a constant when
the template compiles). No check inside the process can interrupt one C-level string product or
power, so the templates of a prompt file are rendered in one child process: its address space is
capped (RLIMIT_AS) after it imports what it needs, the parent kills it at the time budget, and a
rendered prompt over MAX_RENDERED_CHARS is refused before anything tokenizes it.

The child renders with transformers' own `render_jinja_template` and the tokenizer's special
tokens, as `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`
does (a test ties the two). It reads JSON on stdin and writes one JSON line per conversation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from .bounded import cap_memory

# A rendered prompt longer than this is refused before tokenizing (no sensible
# prompts.max_prompt_tokens comes near it: a token is rarely under 2 characters).
MAX_RENDERED_CHARS = 1 << 20
# The child's memory beyond what its imports take.
RENDER_MEMORY_BYTES = 1 << 30
# Wall time for rendering a file's templates: a floor plus a per-row allowance (a typical
# template renders in well under a millisecond).
RENDER_SECONDS = 20.0
RENDER_SECONDS_PER_ROW = 0.02


class TemplateError(ValueError):
    """A chat template that failed or ran past its budget (one line: which limit)."""


def render_budget_s(rows: int) -> float:
    return RENDER_SECONDS + RENDER_SECONDS_PER_ROW * rows


def render_all(
    tokenizer: Any, conversations: list[list[dict[str, Any]]], generation_prompt: bool = True
) -> list[str]:
    """The text of each conversation through the tokenizer's chat template with the generation
    prompt added (a prompt to sample from; `generation_prompt=False`: a whole conversation, its
    last reply included, as a reward model reads it), rendered in a child process;
    TemplateError naming the row (1-based, among `conversations`) and the limit where one fails."""
    if not conversations:
        return []
    try:
        template = tokenizer.get_chat_template()
    except ValueError:
        raise TemplateError("the tokenizer has no chat template, and the prompts are chat messages") from None
    request = {
        "template": template,
        "special_tokens": dict(tokenizer.special_tokens_map),
        "conversations": conversations,
        "generation_prompt": generation_prompt,
        "max_chars": MAX_RENDERED_CHARS,
        "memory_bytes": RENDER_MEMORY_BYTES,
    }
    seconds = render_budget_s(len(conversations))
    cmd = [sys.executable, "-m", f"{__package__}.chat_template"]
    stdin = json.dumps(request, default=str).encode()
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        rows = len(conversations)
        raise TemplateError(f"the chat template ran past {seconds:g} s rendering {rows} rows") from None
    texts: list[str] = []
    for line in done.stdout.splitlines():
        answer = json.loads(line)
        if "error" in answer:
            raise TemplateError(f"row {len(texts) + 1}: {answer['error']}")
        texts.append(answer["text"])
    if len(texts) != len(conversations):
        # Killed by its memory cap where Python could not even raise MemoryError.
        raise TemplateError(
            f"row {len(texts) + 1}: the chat template needed more than {RENDER_MEMORY_BYTES >> 20} MiB "
            f"of memory (the renderer exited {done.returncode})"
        )
    return texts


def _render(request: dict[str, Any]) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    cap_memory(int(request["memory_bytes"]))
    limit = int(request["max_chars"])
    for messages in request["conversations"]:
        try:
            chats, _ = render_jinja_template(  # type: ignore[str-unpack]
                conversations=[[{k: v for k, v in m.items() if v is not None} for m in messages]],
                chat_template=request["template"],
                add_generation_prompt=bool(request.get("generation_prompt", True)),
                **request["special_tokens"],
            )
            text = chats[0]
        except MemoryError:
            error = f"the chat template needed more than {int(request['memory_bytes']) >> 20} MiB of memory"
        except Exception as err:  # a template that fails on these messages: its own error type
            error = f"the chat template failed ({type(err).__name__})"
        else:
            if len(text) <= limit:
                print(json.dumps({"text": text}), flush=True)
                continue
            error = f"the chat template rendered {len(text)} characters, over the {limit} relay takes"
        print(json.dumps({"error": error}), flush=True)
        return


if __name__ == "__main__":
    _render(json.loads(sys.stdin.buffer.read()))
