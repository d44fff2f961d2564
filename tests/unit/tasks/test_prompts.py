from rredcot.common.config import DataConfig, TaskConfig
from rredcot.tasks.data import Problem
from rredcot.tasks.prompts import messages, prompt_ids, prompt_text
from rredcot.tasks.task import build_task

PROBLEM = Problem(id="p", problem="What is 3 * 4?", solution="3 * 4 = 12.\nAnswer: 12", answer="12")
ARITH = build_task(TaskConfig("arith"))


def test_one_shot_puts_the_tasks_example_first():
    msgs = messages(PROBLEM, ARITH, DataConfig(prompt_style="chat_one_shot", system_prompt="Be brief."))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"] == "Be brief."
    assert msgs[1]["content"] == f"{ARITH.instruction}\n\n{ARITH.example.problem}"
    assert msgs[2]["content"] == ARITH.example.solution and msgs[3]["content"].endswith(PROBLEM.problem)


def test_chat_style_has_no_example_and_choice_has_its_own_instruction():
    choice = build_task(TaskConfig("choice"))
    msgs = messages(PROBLEM, choice, DataConfig(prompt_style="chat"))
    assert msgs == [{"role": "user", "content": f"{choice.instruction}\n\n{PROBLEM.problem}"}]
    assert "<letter>" in choice.instruction and "<number>" in ARITH.instruction


def test_plain_and_chat_token_ids(qwen_tok):
    plain = prompt_text(PROBLEM, ARITH, DataConfig(prompt_style="plain"), qwen_tok)
    assert plain.startswith(ARITH.instruction) and plain.endswith("What is 3 * 4?\n") and "7 * 8" in plain
    chat = DataConfig(prompt_style="chat")
    ids = prompt_ids(PROBLEM, ARITH, chat, qwen_tok)
    assert qwen_tok.decode(ids) == prompt_text(PROBLEM, ARITH, chat, qwen_tok)
    assert "<|im_start|>assistant" in qwen_tok.decode(ids)
