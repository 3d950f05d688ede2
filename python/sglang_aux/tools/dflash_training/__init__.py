"""Training a DFlash (or DSpark) draft for a target (`python -m sglang_aux.tools.train_dflash`).

prompt_mix.py  the recipe's mix of prompts: GSM8K, code tasks, chat requests
code_tasks.py  code tasks from the documented functions of installed Python
chat_instructions.py  chat requests the target writes from seed topics (self-instruct)
data.py       GSM8K k-shot prompts, the target's own continuations, the samples file
contamination.py  evaluation prompts kept out of the training data
features.py   the target's aux hidden states per sequence (one EXTEND forward each)
feature_cache.py  the engine, samples and features kept between a search's variants
draft_forward.py  the draft's block forward with dense attention (the training path)
sequence_set.py  the sequences on the device, their batches and random block anchors
block_objective.py  the position-decayed block loss over the LM head (DFlash)
trainer.py    the optimization loop: schedule, time budget, held-out sequences
step_profile.py  where a training step's time goes (--profile-steps)
training_checkpoint.py  the trainer's state and the run's fingerprint (training over runs)
snapshot.py   the running training's draft every so often (a lost machine leaves one)
dspark_objective.py  DSpark's loss (CE + L1 to the target + confidence) on the same loop
export.py     the HF-format draft folder and its README card
evaluate.py   held-out accept length through the Engine's DFlash worker
"""
