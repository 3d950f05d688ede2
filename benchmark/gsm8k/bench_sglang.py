"""GSM8K few-shot accuracy of a running server, at SGLang's benchmark path.

    python -m sglang_aux.launch_server --model-path PATH &
    python benchmark/gsm8k/bench_sglang.py --num-questions 200 --parallel 64

The same harness and flags as `python -m sglang_aux.test.few_shot_gsm8k`.
"""

from sglang_aux.test.few_shot_gsm8k import main

if __name__ == "__main__":
    main()
