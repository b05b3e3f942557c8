"""vLLM's offline-inference quick start, on fd-core.

The same script runs under vLLM with ``from vllm import LLM, SamplingParams``:
results are read vLLM's way, ``output.outputs[0].text``.

    python examples/offline_vllm.py path/to/model
"""

import sys

from fd_core import LLM, SamplingParams

MODEL = sys.argv[1] if len(sys.argv) > 1 else "baidu/ERNIE-4.5-0.3B-PT"

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16)

llm = LLM(model=MODEL, max_model_len=2048)
outputs = llm.generate(prompts, sampling_params)

for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")

conversation = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hello! How can I assist you today?"},
    {"role": "user", "content": "Write an essay about the importance of higher education."},
]
outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
for output in outputs:
    print(f"Chat: {output.outputs[0].text!r} ({len(output.outputs[0].token_ids)} tokens)")
