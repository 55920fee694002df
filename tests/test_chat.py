"""`spec chat`: the session (KV reuse, history, overflow, commands) and the REPL through a pseudo-terminal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pexpect
import pytest
from support import children
from support.tiny_models import CHAT_TEMPLATE, write_model

from spec_cli import Pair, SamplingParams, SpecError, load_pair
from spec_cli.conversation.session import ChatSession, Settings, run_command
from spec_cli.drafting import cost_book


def settings(**changes: object) -> Settings:
    base = dict(sampling=SamplingParams(), draft_max=4, draft_mode="model", draft_p_min=0.0, max_tokens=12)
    base.update(changes)
    return Settings(**base)


def say(session: ChatSession, text: str) -> str:
    for _ in session.reply(text):
        pass
    return session.turns[-1].content


@pytest.fixture()
def pair(chat_target_path: Path, other_draft_path: Path) -> Iterator[Pair]:
    with load_pair(chat_target_path, other_draft_path) as loaded:
        yield loaded


def test_second_turn_evaluates_only_its_new_tokens(pair: Pair) -> None:
    session = ChatSession(pair, settings(), system="be brief")
    say(session, "hello")
    first = session.last
    say(session, "and again")
    second = session.last.stats
    # Everything the caches held after turn one (the prompt and the answer but its last token) is reused.
    assert second.prompt_cached == first.stats.prompt_tokens + len(first.token_ids) - 1
    new_text = "</s>[user] and again</s>[assistant] "  # what the template adds after the first answer
    assert second.prompt_tokens - second.prompt_cached == len(pair.target.tokenize(new_text, add_special=False)) + 1
    assert pair.draft_context.n_past >= second.prompt_cached  # the draft kept the conversation too


def test_greedy_answers_equal_answers_without_drafting(pair: Pair) -> None:
    speculative = ChatSession(pair, settings())
    alone = ChatSession(pair, settings(use_draft=False))
    for message in ("hello", "tell me more", "thanks"):
        assert say(speculative, message) == say(alone, message)
    assert speculative.totals.drafted > 0 and alone.totals.drafted == 0


def test_overflow_drops_the_oldest_turns_and_keeps_the_system_message(chat_target_path: Path) -> None:
    with load_pair(chat_target_path, chat_target_path, n_ctx=96) as small:
        session = ChatSession(small, settings(max_tokens=16), system="sys")
        for i in range(8):
            say(session, f"message number {i}")
        assert any("dropped the" in notice for notice in session.notices)
        assert session.turns[0].content != "message number 0"
        assert session.messages()[0] == {"role": "system", "content": "sys"}
        assert session.last.stats.prompt_tokens + 16 <= 96


def test_a_message_too_long_for_the_context_is_refused_and_history_kept(chat_target_path: Path) -> None:
    with load_pair(chat_target_path, None, n_ctx=64) as small:
        session = ChatSession(small, settings(max_tokens=8, use_draft=False))
        say(session, "hi")
        with pytest.raises(SpecError, match="raise --ctx or lower --max-tokens"):
            say(session, "the cat and the dog " * 20)
        assert [t.content for t in session.turns][0] == "hi" and len(session.turns) == 2


def test_interrupted_answer_stays_marked(pair: Pair, tmp_path: Path) -> None:
    session = ChatSession(pair, settings(max_tokens=40))
    events = session.reply("hello")
    next(events)
    events.close()
    assert session.turns[-1].role == "assistant" and session.turns[-1].interrupted
    run_command(session, f"/save {tmp_path / 'c.json'}")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert saved["turns"][-1]["interrupted"] is True
    run_command(session, f"/save {tmp_path / 'c.md'}")
    assert "_(interrupted)_" in (tmp_path / "c.md").read_text()
    say(session, "go on")  # the next turn still works on consistent caches
    assert len(session.turns) == 4


def test_slash_commands_change_settings(pair: Pair) -> None:
    session = ChatSession(pair, settings())
    assert run_command(session, "/set temp 0.7") == "temp = 0.7"
    assert session.settings.sampling.temperature == 0.7
    run_command(session, "/set k auto")
    assert session.settings.draft_max == "auto"
    run_command(session, "/set top-k 5")
    assert session.settings.sampling.top_k == 5
    run_command(session, "/set repeat-penalty 1.1")
    run_command(session, "/set repeat-last-n 32")
    assert (session.settings.sampling.repeat_penalty, session.settings.sampling.repeat_last_n) == (1.1, 32)
    assert run_command(session, "/set verify token") == "verify = token"
    assert session.settings.verify == "token"
    assert run_command(session, "/set") == ("temp 0.7 · top-k 5 · top-p 0.95 · min-p 0.05 · repeat-penalty 1.1 "
                                            "over 32 · presence 0 · frequency 0 · drafting model K=auto · verify token")
    run_command(session, "/draft off")
    assert session.settings.use_draft is False
    say(session, "hi")
    run_command(session, "/system pirate")
    assert session.system == "pirate" and session.turns == []
    say(session, "hi")
    run_command(session, "/reset")
    assert session.turns == [] and session.system == "pirate"


def test_set_constrains_the_next_answers_and_off_frees_them(pair: Pair, tmp_path: Path) -> None:
    session = ChatSession(pair, settings(max_tokens=20))
    assert run_command(session, '/set grammar root ::= [a-e ]+ "."') == ("output constrained by the grammar "
                                                                         "(off clears it)")
    assert run_command(session, "/set").endswith("· output constrained by a grammar")
    answer = say(session, "hi")
    assert answer and set(answer) <= set("abcde .")
    (tmp_path / "s.json").write_text('{"enum": ["yes", "no"]}', encoding="utf-8")
    run_command(session, f"/set json-schema-file {tmp_path / 's.json'}")
    assert say(session, "hi") in ('"yes"', '"no"')
    assert run_command(session, "/set json-schema off") == "output no longer constrained"
    assert session.settings.grammar is None


@pytest.mark.parametrize("line, message", [
    ("/set temp hot", "bad value for temp: 'hot'"),
    ("/set k -3", "k must be a number from 0 to 64 or 'auto', got -3"),
    ("/set colour red", "usage: /set k|temp|top-k|top-p|min-p|repeat-penalty|repeat-last-n|presence-penalty|"
                        "frequency-penalty|verify|max-tokens|mode|p-min|grammar|grammar-file|json-schema|"
                        "json-schema-file VALUE"),
    ('/set grammar root ::= "a', 'grammar does not parse: Unexpected end of input'),
    ("/set json-schema {", "json-schema is not valid JSON"),
    ("/set grammar-file /nonexistent/g.gbnf", "grammar-file: file not found: /nonexistent/g.gbnf"),
    ("/set verify joint", "unknown verify 'joint'; choose one of: block, token, gumbel"),
    ("/set repeat-penalty 0", "repeat-penalty must be > 0"),
    ("/set repeat-last-n 1.5", "bad value for repeat-last-n"),
    ("/draft maybe", "usage: /draft on|off"),
    ("/save", "usage: /save FILE"),
    ("/frobnicate", "unknown command /frobnicate; known: /help, /stats, /reset, /system, /set, /draft, /image, /save, /exit"),
])
def test_slash_command_mistakes(pair: Pair, line: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace("|", r"\|")):
        run_command(ChatSession(pair, settings()), line)


# --- the REPL ------------------------------------------------------------------------------------------


def chat_command(model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spec_cli", "chat", "--target", str(model), "--draft", str(model), *extra]


def spawn(model: Path, *extra: str) -> pexpect.spawn:
    command = chat_command(model, *extra)
    child = children.spawn(command[0], command[1:], encoding="utf-8", timeout=60, dimensions=(40, 200),
                           env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "HOME": str(model.parent)})
    child.expect("/help for commands")
    return child


def leave(child: pexpect.spawn) -> None:
    """/exit, and the REPL ends cleanly."""
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_repl_streams_answers_with_a_summary_and_commands(chat_target_path: Path) -> None:
    child = spawn(chat_target_path, "-n", "12")
    child.sendline("hello")
    child.expect(r"12 tokens · [\d.]+ tok/s · acceptance [\d.]+% · mean accepted length [\d.]+")
    child.sendline("/stats")
    child.expect("session statistics")
    child.expect("by draft position")
    child.sendline("/nope")
    child.expect("unknown command /nope; known: /help")
    leave(child)


def test_repl_samples_as_the_model_recommends_and_says_so(tmp_path: Path) -> None:
    model = write_model(tmp_path / "recommends.gguf", seed=1, chat_template=CHAT_TEMPLATE,
                        sampling={"temp": 0.6, "top_k": 20, "penalty_repeat": 1.1})
    child = spawn(model, "-n", "4", "--top-p", "0.5")
    child.expect("temp 0.6 · top-k 20 · top-p 0.5 · min-p 0.05 · repeat-penalty 1.1 over 64")
    child.sendline("/set temp 0")
    child.sendline("/set")
    child.expect("greedy · repeat-penalty 1.1 over 64 · presence 0 · frequency 0 · drafting hybrid K=auto")
    leave(child)


def test_repl_ctrl_c_cancels_the_answer_and_returns_to_the_prompt(chat_target_path: Path, tmp_path: Path) -> None:
    # A seed whose answer runs for thousands of tokens: with a random one the tiny model may reach its end of
    # generation just as Ctrl-C arrives, and the answer is then complete, not interrupted.
    child = spawn(chat_target_path, "-n", "20000", "--ctx", "30000", "--seed", "3")
    child.sendline("hello")
    child.expect("hello\r\n")
    child.expect(".{40}")  # the answer is streaming
    child.sendintr()
    child.expect("answer interrupted")
    child.expect(">>> ")
    child.sendline(f"/save {tmp_path / 'conversation.json'}")
    child.expect("saved to")
    child.expect(">>> ")  # readline is reading again: Ctrl-D now means end of input
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    turns = json.loads((tmp_path / "conversation.json").read_text())["turns"]
    assert turns[0] == {"role": "user", "content": "hello"} and turns[1]["interrupted"] is True


def test_repl_ctrl_c_right_after_enter_keeps_the_session(chat_target_path: Path) -> None:
    """Ctrl-C within the moment after Enter (while a paste is checked for) used to end `spec chat` with
    status 130, losing the conversation; it cancels that message or its answer instead."""
    child = spawn(chat_target_path, "-n", "20000", "--ctx", "30000")
    child.expect(">>> ")
    for _ in range(3):
        child.sendline("hello")
        time.sleep(0.005)  # the line is read; the 20 ms check for more pasted lines is running
        child.sendintr()
        child.expect(">>> ")
    leave(child)


def test_repl_joins_continued_lines_into_one_message(chat_target_path: Path, tmp_path: Path) -> None:
    child = spawn(chat_target_path, "-n", "4")
    child.sendline("first line\\")
    child.expect(r"\.\.\. ")
    child.sendline("second line")
    child.expect("4 tokens")
    child.sendline(f"/save {tmp_path / 'c.json'}")
    child.expect("saved to")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    turns = json.loads((tmp_path / "c.json").read_text())["turns"]
    assert turns[0]["content"] == "first line\nsecond line" and len(turns) == 2


def test_piped_chat_answers_each_line_plainly(chat_target_path: Path) -> None:
    completed = subprocess.run(chat_command(chat_target_path, "-n", "6", "--temp", "0"), input="hello\nhow are you\n",
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    answers = completed.stdout.split("\n")
    assert len(answers) == 3 and answers[2] == ""
    assert "\x1b" not in completed.stdout
    with load_pair(chat_target_path, None) as alone:
        session = ChatSession(alone, settings(max_tokens=6, use_draft=False))
        assert [say(session, "hello"), say(session, "how are you")] == answers[:2]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_chat_stopped_by_sigterm_or_a_hang_up_keeps_what_it_measured(chat_target_path: Path,
                                                                     stop: signal.Signals) -> None:
    """SIGTERM (`kill`, a supervising script) or SIGHUP (its terminal closed) ends a chat as its end of input would,
    with that signal's status: the pair closes and the cost book is written (the process died where it stood, its
    memory lost with the window). Ctrl-C cancels a line or an answer here, so it is not Ctrl-C's path."""
    process = children.popen(chat_command(chat_target_path, "-n", "6", "--temp", "0"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdin.write("hello\n")
    process.stdin.flush()
    answer = process.stdout.readline()  # the first answer is out: the chat waits for the next line
    process.send_signal(stop)
    _out, err = process.communicate(timeout=60)
    assert answer.strip() and process.returncode == 128 + stop and "Traceback" not in err
    assert cost_book.read_all()


def test_piped_chat_replaces_bytes_that_are_not_utf8(chat_target_path: Path) -> None:
    completed = subprocess.run(chat_command(chat_target_path, "-n", "4", "--temp", "0"), input=b"Say \xff\xfe hi\n",
                               capture_output=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    stderr = completed.stderr.decode()
    assert "the message is not valid UTF-8" in stderr and "Traceback" not in stderr
    with load_pair(chat_target_path, None) as alone:
        session = ChatSession(alone, settings(max_tokens=4, use_draft=False))
        assert completed.stdout.decode().split("\n")[0] == say(session, "Say \ufffd\ufffd hi")


def test_model_without_template_needs_a_chat_format(target_path: Path) -> None:
    completed = subprocess.run(chat_command(target_path), input="hi\n", capture_output=True, text=True, timeout=60)
    assert completed.returncode == 1
    assert "has no chat template in its GGUF metadata; give one with --chat-format" in completed.stderr
    with_format = subprocess.run(chat_command(target_path, "--chat-format", "chatml", "-n", "3"), input="hi\n",
                                 capture_output=True, text=True, timeout=60)
    assert with_format.returncode == 0, with_format.stderr
