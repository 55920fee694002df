"""Chat templates written here in the style of each tool-call convention (none copied from a model): ChatML
turns, the tools listed in the system turn with one example call, past calls written in the convention and
results in a `tool` turn. `THINKING` opens a thought in the prompt, as Qwen3.5/3.6's do."""

from __future__ import annotations

CALLS = {  # how each convention's template writes a past call `c` (its arguments an object)
    "hermes": '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n'
              '</tool_call>',
    "qwen3-xml": "<tool_call>\n<function={{ c.function.name }}>\n{% for k, v in c.function.arguments.items() %}"
                 "<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>",
    "llama3-json": '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}',
    "mistral": "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}",
    "pythonic": "<|tool_call_start|>[{{ c.function.name }}({% for k, v in c.function.arguments.items() %}"
                "{{ k }}={{ v | tojson }}{% if not loop.last %}, {% endif %}{% endfor %})]<|tool_call_end|>",
    "harmony": "<|channel|>commentary to=functions.{{ c.function.name }} <|constrain|>json<|message|>"
               "{{ c.function.arguments | tojson }}<|call|>",
}


def template(convention: str, thinking: bool = False) -> str:
    """A template whose past calls are written in `convention`."""
    call = CALLS[convention]
    return (
        "{% if tools %}<|im_start|>system\nYou can call these tools:\n{% for t in tools %}{{ t.function | tojson }}\n"
        "{% endfor %}To call one, write the call like this example and nothing else:\n"
        "{% set c = {'function': {'name': tools[0].function.name, 'arguments': {'city': 'Oslo'}}} %}" + call +
        "<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
        "{% for c in m.tool_calls or [] %}" + call + "{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n" + ("<think>\n" if thinking else "") + "{% endif %}"
    )


UNKNOWN = template("hermes").replace("<tool_call>", "<<call>>").replace("</tool_call>", "<</call>>")
