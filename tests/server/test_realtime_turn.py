"""The realtime turn's state machine (``server/routes/realtime/turn.py``) as a table: a state, an event and what
holds then -> the next state and the actions, in order. The controller that performs them is exercised on real
servers by test_realtime.py, test_realtime_voice_turn.py and test_semantic_vad.py."""

from __future__ import annotations

import pytest

from omnipipe.server.routes.realtime.turn import (
    Action,
    Cleared,
    Closed,
    CommitAsked,
    DetectionChanged,
    IdleTimedOut,
    InputsChanged,
    Now,
    ResponseEnded,
    ResponseStarted,
    SessionPaused,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    Step,
    TurnEvent,
    TurnState,
    transition,
)

S = TurnState
A = Action
VAD = Now(speculate=True)  # server VAD, speculative start on, nothing answering
ANSWERING = Now(answering=True, speculate=True)
KEEP_ANSWERING = Now(answering=True, speculate=True, interrupt=False)  # interrupt_response false
NO_RESPONSE = Now(respond=False)  # create_response false (then no tentative answer either)
CLIENT = Now()  # the client commits (no turn detection)

TABLE: list[tuple[str, TurnState, TurnEvent, Now, Step]] = [
    # one spoken turn under server VAD: speech, a pause that starts an answer, the end that releases it
    ("speech starts", S.LISTENING, SpeechStarted(200), VAD, Step(S.SPEAKING)),
    ("a pause starts an answer", S.SPEAKING, SpeechPaused(900), VAD, Step(S.TENTATIVE, (A.START_TENTATIVE,))),
    ("the user goes on: dropped", S.TENTATIVE, SpeechResumed(1100), VAD, Step(S.SPEAKING, (A.DROP_TENTATIVE,))),
    ("the turn ends: commit, respond with it", S.TENTATIVE, SpeechStopped(900, 1.0), VAD,
     Step(S.ANSWERING, (A.COMMIT, A.RESPOND))),
    ("the end without a pause", S.SPEAKING, SpeechStopped(900, 1.0), VAD, Step(S.ANSWERING, (A.COMMIT, A.RESPOND))),
    ("the answer ends", S.ANSWERING, ResponseEnded(), VAD, Step(S.LISTENING)),
    # no tentative answer where none is wanted
    ("a pause, no speculation", S.SPEAKING, SpeechPaused(900), Now(), Step(S.PAUSED)),
    ("a paused user goes on", S.PAUSED, SpeechResumed(1100), VAD, Step(S.SPEAKING)),
    ("a turn ends, no response asked", S.PAUSED, SpeechStopped(900, 1.0), NO_RESPONSE, Step(S.COMMITTED, (A.COMMIT,))),
    # barge-in, also during a tentative answer
    ("barge-in", S.ANSWERING, SpeechStarted(100), ANSWERING, Step(S.INTERRUPTED, (A.BARGE_IN,))),
    ("barge-in during a tentative answer", S.TENTATIVE, SpeechStarted(100), ANSWERING,
     Step(S.INTERRUPTED, (A.DROP_TENTATIVE, A.BARGE_IN))),
    ("the cancelled answer's end", S.INTERRUPTED, ResponseEnded(), VAD, Step(S.INTERRUPTED)),
    ("the interrupting speech pauses", S.INTERRUPTED, SpeechPaused(700), VAD, Step(S.TENTATIVE, (A.START_TENTATIVE,))),
    ("the interrupting turn ends", S.INTERRUPTED, SpeechStopped(700, 1.0), VAD,
     Step(S.ANSWERING, (A.COMMIT, A.RESPOND))),
    ("speech over an answer it may not interrupt", S.ANSWERING, SpeechStarted(100), KEEP_ANSWERING,
     Step(S.SPEAKING)),
    # a pause while an answer (a function call) runs: no tentative answer; the turn waits for it
    ("a pause during a function call", S.SPEAKING, SpeechPaused(700), KEEP_ANSWERING, Step(S.PAUSED)),
    ("the turn ends during a function call", S.PAUSED, SpeechStopped(700, 1.0), KEEP_ANSWERING,
     Step(S.COMMITTED, (A.COMMIT,))),
    ("the function call's answer ends", S.COMMITTED, ResponseEnded(), VAD, Step(S.COMMITTED)),
    ("session.pause during a function call", S.ANSWERING, SessionPaused(), ANSWERING,
     Step(S.LISTENING, (A.CANCEL, A.RESET))),
    ("session.pause during a tentative answer", S.TENTATIVE, SessionPaused(), VAD, Step(S.LISTENING, (A.RESET,))),
    # input_audio_buffer.clear: the buffer only
    ("clear while speaking", S.SPEAKING, Cleared(), VAD, Step(S.LISTENING, (A.RESET,))),
    ("clear during a tentative answer", S.TENTATIVE, Cleared(), VAD, Step(S.LISTENING, (A.RESET,))),
    ("clear while answering", S.ANSWERING, Cleared(), ANSWERING, Step(S.ANSWERING, (A.RESET,))),
    ("clear after a commit", S.COMMITTED, Cleared(), CLIENT, Step(S.COMMITTED, (A.RESET,))),
    # the client's commit and response.create
    ("the client commits", S.LISTENING, CommitAsked(1.0), CLIENT, Step(S.COMMITTED, (A.COMMIT,))),
    ("the client commits over a tentative answer", S.TENTATIVE, CommitAsked(1.0), VAD,
     Step(S.COMMITTED, (A.DROP_TENTATIVE, A.COMMIT))),
    ("the client answers", S.COMMITTED, ResponseStarted(), ANSWERING, Step(S.ANSWERING)),
    ("the client answers typed items", S.LISTENING, ResponseStarted(), ANSWERING, Step(S.ANSWERING)),
    ("the client answers during a tentative answer", S.TENTATIVE, ResponseStarted(), ANSWERING,
     Step(S.PAUSED, (A.DROP_TENTATIVE,))),
    # what a tentative answer was planned from changes: it is dropped (the answer is planned once)
    ("session.update or an item during a tentative answer", S.TENTATIVE, InputsChanged(), VAD,
     Step(S.PAUSED, (A.DROP_TENTATIVE,))),
    ("an item while speaking", S.SPEAKING, InputsChanged(), VAD, Step(S.SPEAKING)),
    ("a new VAD during a tentative answer", S.TENTATIVE, DetectionChanged(), VAD,
     Step(S.LISTENING, (A.DROP_TENTATIVE,))),
    ("a new VAD after a commit", S.COMMITTED, DetectionChanged(), VAD, Step(S.COMMITTED)),
    # idle_timeout_ms: the silence committed and answered, never over speech or an answer
    ("idle timeout", S.LISTENING, IdleTimedOut(), VAD, Step(S.ANSWERING, (A.COMMIT, A.RESPOND))),
    ("idle timeout while speaking", S.SPEAKING, IdleTimedOut(), VAD, Step(S.SPEAKING)),
    ("idle timeout while answering", S.LISTENING, IdleTimedOut(), ANSWERING, Step(S.LISTENING)),
    # the close: the answer cancelled, the buffer emptied, then nothing moves the turn
    ("close while answering", S.ANSWERING, Closed(), ANSWERING, Step(S.DONE, (A.CANCEL, A.RESET))),
    ("close during a tentative answer", S.TENTATIVE, Closed(), VAD, Step(S.DONE, (A.RESET,))),
    ("close while listening", S.LISTENING, Closed(), VAD, Step(S.DONE, (A.RESET,))),
    ("speech after the close", S.DONE, SpeechStarted(0), VAD, Step(S.DONE)),
    ("an answer's end after the close", S.DONE, ResponseEnded(), ANSWERING, Step(S.DONE)),
    ("a commit after the close", S.DONE, CommitAsked(1.0), CLIENT, Step(S.DONE)),
]


@pytest.mark.parametrize(("state", "event", "now", "step"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_turn_transition(state: TurnState, event: TurnEvent, now: Now, step: Step) -> None:
    assert transition(state, event, now) == step


def test_a_tentative_answer_is_held_only_in_its_state() -> None:
    """From every state, on every event: a transition into TENTATIVE starts an answer, and one out of it drops the
    answer or gives it to the response (RESPOND) or empties everything (RESET); no other step touches it."""
    events: list[TurnEvent] = [SpeechStarted(0), SpeechPaused(0), SpeechResumed(0), SpeechStopped(0, 0.0),
                               CommitAsked(0.0), IdleTimedOut(), Cleared(), InputsChanged(), DetectionChanged(),
                               ResponseStarted(), ResponseEnded(), SessionPaused(), Closed()]
    nows = [Now(answering=a, speculate=s, respond=r, interrupt=i)
            for a in (False, True) for s in (False, True) for r in (False, True) for i in (False, True)]
    for state in TurnState:
        for event in events:
            for now in nows:
                step = transition(state, event, now)
                ends = {A.DROP_TENTATIVE, A.RESPOND, A.RESET} & set(step.actions)
                if state is S.TENTATIVE and step.state is not S.TENTATIVE:
                    assert ends, (state, event, now, step)
                if step.state is S.TENTATIVE and state is not S.TENTATIVE:
                    assert step.actions == (A.START_TENTATIVE,), (state, event, now, step)
                if A.START_TENTATIVE in step.actions:
                    assert step.state is S.TENTATIVE and not now.answering and now.speculate, (state, event, now)
                if A.DROP_TENTATIVE in step.actions:
                    assert state is S.TENTATIVE, (state, event, now, step)
                if A.BARGE_IN in step.actions or A.CANCEL in step.actions:
                    assert now.answering, (state, event, now, step)
