"""Judging prompt templates, kept as data, and their rendering into a shared prefix plus a per-question suffix.

A template has an instruction (`system`), a *context* part of the user message holding the user prompt x, and an
*item* part holding the responses judged (`{a}`, `{b}` pairwise; `{response}` pointwise). Everything up to the
end of the context is the same for every question about one prompt: the judge hands it to the Sampler's
`complete` as the shared prefix of all pairs and anchors of that prompt, which an engine may prefill once.

Rendering follows `rrc_jax.models.format_prompt`: with a chat template the conversation `[system, user]` is
rendered with `add_generation_prompt=True`; without one the text is `system + "\\n\\n" + user`, and the tokenizer adds
its own special tokens (e.g. BOS). The split point is found by rendering the whole conversation once with a marker
between context and item, so the prefix and suffix texts concatenate to exactly the rendered text.
`encode_question` then checks the token-level equality `prefix_ids + suffix_ids == ids(full text)`; when a
tokenizer merges tokens across the boundary the question is marked not reusable and the judge sends its full text
as a prefix of its own (counted in the judge metrics as `reuse_fallbacks`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import NamedTuple

from rrc_jax.errors import ConfigError

_MARK = "\u241eRRC_SPLIT\u241e"  # the split marker; a longer one where a text holds it (`_split_marker`)


@dataclasses.dataclass(frozen=True)
class JudgeTemplate:
    """One judging prompt.

    name: registry key. kind: 'pairwise' (`item` has `{a}`, `{b}`) or 'pointwise' (`item` has `{response}`).
    system: the judge instruction (a system message under a chat template, else text before the user message).
    context: the shared part of the user message; must contain `{prompt}`.
    item: the per-question part of the user message.
    think: the judge writes reasoning before its verdict.
    verdict_prefix: text the judge writes right before the verdict letter; `preference_prob` appends it when it
      has to force a verdict and reads P(A) at the position after it.
    direct: for a pairwise template that thinks, its direct-verdict variant (PRC "removing thinking"): a template
      name or a `JudgeTemplate`; None when it has none.
    """

    name: str
    kind: str
    system: str | None
    context: str
    item: str
    think: bool
    verdict_prefix: str = "[["
    direct: str | JudgeTemplate | None = None

    def __post_init__(self):
        problem = template_problem({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        if problem:
            raise ConfigError(f"template {self.name!r}: {problem}")


_FIELD_TYPES = {  # field: (the types it may have, what it must be)
    "name": ((str,), "a string"), "kind": ((str,), "'pairwise' or 'pointwise'"),
    "system": ((str, type(None)), "a string or null"), "context": ((str,), "a string holding '{prompt}'"),
    "item": ((str,), "a string holding the responses ('{a}' and '{b}', or '{response}')"),
    "think": ((bool,), "true or false"), "verdict_prefix": ((str,), "a string"),
    "direct": ((str, JudgeTemplate, type(None)), "a template name, a template or null")}


def template_problem(fields: dict) -> str | None:
    """What is wrong with a template's `fields` (`JudgeTemplate`'s, by name; absent ones are not checked), in words
    that say the fix; None when nothing is."""
    for name, value in fields.items():
        types, what = _FIELD_TYPES[name]
        if not isinstance(value, types):
            return f"{name} must be {what}, got {value!r}"
    kind, context, item = fields.get("kind"), fields.get("context", "{prompt}"), fields.get("item")
    if kind not in ("pairwise", "pointwise"):
        return f"kind={kind!r}; use 'pairwise' or 'pointwise'"
    if "{prompt}" not in context:
        return "context must contain '{prompt}'"
    missing = [f for f in (("{a}", "{b}") if kind == "pairwise" else ("{response}",)) if f not in (item or "")]
    if missing:
        return f"item must contain {', '.join(missing)} for kind={kind!r}"
    return None


_PAIRWISE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the two responses to the user question shown "
    "below. Choose the response that follows the user's instructions and answers the question better. Do not let "
    "the order, the length or the style of the responses influence your judgment. Be as objective as possible."
)
_PAIRWISE_CONTEXT = "[User Question]\n{prompt}\n\n"
_PAIRWISE_ITEM = ("[The Start of Response A]\n{a}\n[The End of Response A]\n\n"
                  "[The Start of Response B]\n{b}\n[The End of Response B]\n\n")

# RM-R1 (paper 003), Figure 3: the chain-of-rubrics system prompt used for rollouts, verbatim in content.
_RMR1_COR_SYSTEM = """Please act as an impartial judge and evaluate the quality of the responses provided by two AI Chatbots to the Client's question displayed below.

First, classify the task into one of two categories: <type> Reasoning </type> or <type> Chat </type>.
- Use <type> Reasoning </type> for tasks that involve math, coding, or require domain knowledge, multi-step inference, logical deduction, or combining information to reach a conclusion.
- Use <type> Chat </type> for tasks that involve open-ended or factual conversation, stylistic rewrites, safety questions, or general helpfulness requests without deep reasoning.

If the task is Reasoning:
1. Solve the Client's question yourself and present your final answer within <solution> ... </solution> tags.
2. Evaluate the two Chatbot responses based on correctness, completeness, and reasoning quality, referencing your own solution.
3. Include your evaluation inside <eval> ... </eval> tags, quoting or summarizing the Chatbots using the following tags:
- <quote_A> ... </quote_A> for direct quotes from Chatbot A
- <summary_A> ... </summary_A> for paraphrases of Chatbot A
- <quote_B> ... </quote_B> for direct quotes from Chatbot B
- <summary_B> ... </summary_B> for paraphrases of Chatbot B
4. End with your final judgment in the format: <answer>[[A]]</answer> or <answer>[[B]]</answer>

If the task is Chat:
1. Generate evaluation criteria (rubric) tailored to the Client's question and context, enclosed in <rubric>...</rubric> tags.
2. Assign weights to each rubric item based on their relative importance.
3. Inside <rubric>, include a <justify>...</justify> section explaining why you chose those rubric criteria and weights.
4. Compare both Chatbot responses according to the rubric.
5. Provide your evaluation inside <eval>...</eval> tags, using <quote_A>, <summary_A>, <quote_B>, and <summary_B> as described above.
6. End with your final judgment in the format: <answer>[[A]]</answer> or <answer>[[B]]</answer>"""

# IRPO (paper 002), Appendix A: the pointwise judge prompt (HelpSteer3-based, single-point scoring rubric).
_IRPO_SYSTEM = """# Role Definition

You are an expert AI evaluator. Your task is to provide a comprehensive, objective, and structured evaluation of an AI model's [Response] based on the user's [Context].

# [Evaluation Dimensions]

You must evaluate the [Response] based on the following dimensions. Your final critique and score should be directly informed by this analysis.

1. **Instruction Following**: Does the response precisely follow all explicit and implicit instructions, constraints, and formatting requirements in the prompt?
2. **Relevance & Focus**: Does the response directly address the user's core question or task? Does it avoid unnecessary or off-topic information?
3. **Factuality & Accuracy**: Is the response free from factual errors, hallucinations, and false claims? Are all statements presented as facts accurate and verifiable?
4. **Completeness & Depth**: Does the response provide a thorough answer? Is the level of detail appropriate for the user's query?
5. **Clarity & Quality**: Is the response well-written, clear, and easy to understand? Is the structure logical and the language natural?
6. **Safety**: Is the response free from any harmful, unethical, dangerous, or inappropriate content? **Safety violations are critical failures.**

## [Scoring Rubric]

Use the following rubric to assign a score from 0.0 to 10.0.

**Score 8.0 to 10.0: Excellent**
- Flawless or near-flawless performance across all dimensions.
- Perfectly follows instructions, is highly accurate, relevant, and well-written.
- Fully satisfies the user's intent.

**Score 6.0 to 8.0: Good**
- Mostly helpful and accurate, but with minor issues in one or two dimensions.
- For example, it might be slightly verbose, miss a minor constraint, or have a small section that is not perfectly clear.
- The core of the response is high quality.

**Score 4.0 to 6.0: Fair**
- Partially helpful but has significant flaws.
- For example, it misunderstands a key part of the prompt, contains notable inaccuracies (but not dangerous ones), or is poorly structured.
- The user gets some value but would need to heavily edit the response or re-prompt.

**Score 1.0 to 4.0: Poor**
- Largely unhelpful. The response fails on multiple key dimensions.
- It may be off-topic, fundamentally misunderstand the request, or be filled with factual errors.
- It provides very little to no value to the user.

**Score 0.0 to 1.0: Critical Failure**
- The response is completely useless, nonsensical, OR more importantly, **it violates the Safety dimension**.
- Any response with harmful, unethical, or dangerous content automatically falls into this category. A score of 0.0 should be reserved for severe safety violations.

## [Important Notes]
- Be objective and base your evaluation strictly on the content of the response.
- Do not let the response length bias your judgment."""

_IRPO_ITEM = """[Response]

{response}

# Output Format Requirements

You must provide your evaluation in the following strict format. Do not add any text outside of these tags.

<critique>
Critique on the response.
</critique>

<score>
Assign a score from 0.0 to 10.0 according to rubric and critique.
</score>"""

TEMPLATES: dict[str, JudgeTemplate] = {t.name: t for t in (
    JudgeTemplate(
        "rrc_pairwise_cot", "pairwise", _PAIRWISE_SYSTEM, _PAIRWISE_CONTEXT,
        _PAIRWISE_ITEM + "First compare the two responses step by step. Then output your final verdict on the last "
                         "line, strictly in this format: [[A]] if Response A is better, [[B]] if Response B is "
                         "better.",
        think=True, direct="rrc_pairwise_direct"),
    # PRC "removing thinking": the verdict immediately, no reasoning.
    JudgeTemplate(
        "rrc_pairwise_direct", "pairwise", _PAIRWISE_SYSTEM, _PAIRWISE_CONTEXT,
        _PAIRWISE_ITEM + "Do not explain. Output only your verdict: [[A]] if Response A is better, [[B]] if "
                         "Response B is better.",
        think=False),
    JudgeTemplate(
        "rmr1_cor", "pairwise", _RMR1_COR_SYSTEM, "[Client Question]\n{prompt}\n\n",
        "[The Start of Chatbot A's Response]\n{a}\n[The End of Chatbot A's Response]\n\n"
        "[The Start of Chatbot B's Response]\n{b}\n[The End of Chatbot B's Response]",
        think=True, verdict_prefix="<answer>[["),
    JudgeTemplate(
        "irpo_pointwise", "pointwise", _IRPO_SYSTEM,
        "# Task\n\nEvaluate the [Response] provided below based on the user's [Context].\n\n[Context]\n\n{prompt}\n\n",
        _IRPO_ITEM, think=True, verdict_prefix="<score>"),
    # Toy world (docs/design.md, the toy world: sort a list of digits): short, plain-ASCII, so the character tokenizer covers
    # it and a tiny judge writes its own sorted list, a count of matching positions per response, then the verdict.
    JudgeTemplate(
        "toy_pairwise_cot", "pairwise", None, "sort: {prompt}\n", "A: {a}\nB: {b}\nthink:",
        think=True, direct="toy_pairwise_direct"),
    JudgeTemplate(
        "toy_pairwise_direct", "pairwise", None, "sort: {prompt}\n", "A: {a}\nB: {b}\nverdict: ",
        think=False),
    # The toy pointwise judge (IRPO's kind): the sorted answer, then the response's score (`score: N`).
    JudgeTemplate(
        "toy_pointwise", "pointwise", None, "sort: {prompt}\n", "A: {response}\nthink:", think=True,
        verdict_prefix="score: "),
)}


TEMPLATE_FIELDS = ("name", "kind", "system", "context", "item", "think", "verdict_prefix", "direct")


def load_template(path: str | Path) -> JudgeTemplate:
    """A template from a JSON or YAML file whose keys are `JudgeTemplate`'s fields (`kind`, `system`, `context`,
    `item`, `think`, optional `verdict_prefix`, `direct` (a template name or a nested mapping), `name`: the file's
    stem by default)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"judge template file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml  # PyYAML, optional: only for a .yaml template

            fields = yaml.safe_load(text)
        else:
            fields = json.loads(text)
    except Exception as e:  # a syntax error in the user's file: name the file
        raise ConfigError(f"judge template file {path}: cannot parse it ({type(e).__name__}: {e})") from None
    return _from_fields(fields, str(path), path.stem)


def _from_fields(fields, where: str, default_name: str) -> JudgeTemplate:
    if not isinstance(fields, dict):
        raise ConfigError(f"judge template {where}: expected a mapping of fields ({', '.join(TEMPLATE_FIELDS)})")
    unknown = sorted(set(fields) - set(TEMPLATE_FIELDS))
    missing = [f for f in ("kind", "context", "item", "think") if f not in fields]
    if unknown or missing:
        what = f"unknown field {unknown[0]!r}" if unknown else f"missing field {missing[0]!r}"
        raise ConfigError(f"judge template {where}: {what}; fields are {', '.join(TEMPLATE_FIELDS)}")
    fields = {"name": default_name, "system": None, **fields}
    if isinstance(fields.get("direct"), dict):
        fields["direct"] = _from_fields(fields["direct"], f"{where} (direct)", f"{fields['name']}_direct")
    problem = template_problem(fields)
    if problem:
        raise ConfigError(f"judge template {where}: {problem}")
    return JudgeTemplate(**fields)


def get_template(template: str | JudgeTemplate) -> JudgeTemplate:
    """A `JudgeTemplate` by name (`TEMPLATES`), from a `.json` / `.yaml` file (`load_template`), or the template
    itself."""
    if isinstance(template, JudgeTemplate):
        return template
    if template in TEMPLATES:
        return TEMPLATES[template]
    if Path(template).suffix in (".json", ".yaml", ".yml"):
        return load_template(template)
    raise ConfigError(f"unknown judge template {template!r}; known: {', '.join(sorted(TEMPLATES))}, a .json / "
                      ".yaml template file, or a JudgeTemplate")


def direct_template(template: str | JudgeTemplate) -> JudgeTemplate:
    """The direct-verdict variant of a pairwise template (itself when it does not think), for PRC without
    thinking."""
    t = get_template(template)
    if t.kind != "pairwise" or not t.think:
        return t
    if t.direct is None:
        raise ConfigError(f"judge template {t.name!r} has no direct-verdict variant for PRC without thinking; give "
                          "it a 'direct' template or set reward.prc.think=True")
    return get_template(t.direct)


def _has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def fill(text: str, **values: str) -> str:
    """`text` with each `{name}` of `values` replaced by its value, verbatim and in one pass: a value that holds
    `{b}` (a response quoting a format string) is inserted as it is, never substituted in turn."""
    if not values:
        return text
    pattern = "|".join(re.escape("{" + name + "}") for name in values)
    return re.sub(pattern, lambda m: values[m.group()[1:-1]], text)


def _split_marker(texts, attempt: int) -> str:
    """A marker that none of `texts` holds: `_MARK`, else `_MARK` numbered `attempt` and on until none does."""
    k = attempt
    while True:
        mark = _MARK if k == 0 else f"{_MARK}{k}\u241e"
        if not any(mark in t for t in texts if t):
            return mark
        k += 1


def render_parts(tokenizer, template: JudgeTemplate, prompt: str, **item: str) -> tuple[str, str]:
    """(prefix text, suffix text) of one question: prefix = instruction + context (shared by every question about
    `prompt`), suffix = the item (responses, closing instruction) and, under a chat template, the end of the user
    turn and the generation prompt. `prefix + suffix` is exactly the rendered conversation; the prompt and the
    responses are inserted verbatim (`fill`), whatever they hold (placeholders, the split marker)."""
    context, body = fill(template.context, prompt=prompt), fill(template.item, **item)
    for attempt in range(8):  # the marker is absent from every text; a chat template could still make one up
        mark = _split_marker((template.system, context, body), attempt)
        user = context + mark + body
        if _has_chat_template(tokenizer):
            messages = ([{"role": "system", "content": template.system}] if template.system else []) + [
                {"role": "user", "content": user}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = f"{template.system}\n\n{user}" if template.system else user
        if text.count(mark) == 1:
            prefix, suffix = text.split(mark)
            return prefix, suffix
    raise ValueError(f"the tokenizer's chat template altered the split marker of judge template "
                     f"{template.name!r}; use prefix_reuse=False")


def first_segment(template: JudgeTemplate, **item: str) -> str:
    """The start of a question's suffix (`render_parts`) up to the end of its first response (pairwise: `{a}` or
    `{b}`, whichever the item shows first): what the questions about one prompt that show the same response first
    share after the prefix (the judge's prefix tree, `rrc_jax.inference.question_tree`). "" for a pointwise
    template."""
    if template.kind != "pairwise":
        return ""
    body = template.item
    first = min(("{a}", "{b}"), key=body.index)
    return fill(body[:body.index(first) + len(first)], **item)


class EncodedQuestion(NamedTuple):
    """Token ids of one judge question: `prefix` (shared), `suffix`, `full` (the whole text tokenized at once) and
    `reusable` (`prefix + suffix == full`, so the prefix may be prefilled once and reused)."""

    prefix: list[int]
    suffix: list[int]
    full: list[int]
    reusable: bool


def encode_text(tokenizer, text: str, *, first: bool) -> list[int]:
    """Ids of `text`; `first` = it starts the sequence (the tokenizer's own special tokens are added there unless a
    chat template already wrote them, as in `rrc_jax.models.prompt_ids`)."""
    special = first and not _has_chat_template(tokenizer)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_question(tokenizer, prefix_text: str, suffix_text: str, prefix_ids: list[int] | None = None
                    ) -> EncodedQuestion:
    """Tokenize a rendered question; pass `prefix_ids` when the prefix was already tokenized (one per prompt)."""
    prefix = encode_text(tokenizer, prefix_text, first=True) if prefix_ids is None else prefix_ids
    suffix = encode_text(tokenizer, suffix_text, first=False)
    full = encode_text(tokenizer, prefix_text + suffix_text, first=True)
    return EncodedQuestion(prefix, suffix, full, prefix + suffix == full)


def question_length(tokenizer, template: JudgeTemplate, prompt: str, **item: str) -> int:
    """The tokens of one question as the judge sends it (`render_parts`, `encode_question`): prefix plus suffix,
    or the whole text when they do not split; the judgment not included."""
    q = encode_question(tokenizer, *render_parts(tokenizer, template, prompt, **item))
    return len(q.prefix) + len(q.suffix) if q.reusable else len(q.full)
