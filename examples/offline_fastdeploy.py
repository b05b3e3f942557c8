"""FastDeploy's offline-inference example (docs/offline_inference.md), on fd-core.

Only two things differ from FastDeploy's page: the import line
(``from fastdeploy import ...`` -> ``from fd_core import ...``) and the model
(a path given on the command line; ``max_model_len`` 2048 fits the small
generated checkpoints the tests use). Results are read FastDeploy's way:
``output.outputs.text`` and ``output.outputs.reasoning_content``.

    python examples/offline_fastdeploy.py path/to/ERNIE-4.5-0.3B-Paddle
"""

import sys

from fd_core import LLM, SamplingParams

MODEL = sys.argv[1] if len(sys.argv) > 1 else "baidu/ERNIE-4.5-0.3B-Paddle"

msg1 = [
    {"role": "system", "content": "I'm a helpful AI assistant."},
    {"role": "user", "content": "把李白的静夜思改写为现代诗"},
]
msg2 = [
    {"role": "system", "content": "I'm a helpful AI assistant."},
    {"role": "user", "content": "Write me a poem about large language model."},
]
messages = [msg1, msg2]

# Sampling parameters
sampling_params = SamplingParams(top_p=0.95, max_tokens=6400)

# Load model (reasoning_parser: split the chain of thought into reasoning_content)
llm = LLM(model=MODEL, tensor_parallel_size=1, max_model_len=2048, reasoning_parser="ernie_x1")
# Batch inference (internal request queuing and dynamic batching)
outputs = llm.chat(messages, sampling_params)

# Output results
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs.text
    reasoning_text = output.outputs.reasoning_content
    print(f"chat reasoning: {reasoning_text!r}")
    print(f"chat answer: {generated_text!r}")

# Text completion interface (LLM.generate)
prompts = [
    "User: Write a 500-word travel note about Wenxin Park in Shenzhen.\nAssistant: ",
]
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs.text
    print(f"generate: {generated_text!r}")
