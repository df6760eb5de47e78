"""A handful of grade-school maths questions in GSM8K's test-set format, written by this project, so
the accuracy check's flow (sglang's ``few_shot_gsm8k``) runs without downloading GSM8K: one JSON
object per line, ``question`` and ``answer`` with the worked answer ending ``#### N``, which is
what ``few_shot_gsm8k`` builds its few-shot prompt and its labels from. Not GSM8K's questions: a
score on them says nothing of a model, only that the pipeline ran and computed one."""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS = [
    ("Tom has 3 boxes with 4 apples in each box. He eats 2 apples. How many apples are left?",
     "Tom had 3 * 4 = <<3*4=12>>12 apples.\nAfter eating 2 he has 12 - 2 = <<12-2=10>>10 apples.\n#### 10"),
    ("A pencil costs 2 dollars and a notebook costs 5 dollars. How much do 3 pencils and 2 notebooks cost?",
     "3 pencils cost 3 * 2 = <<3*2=6>>6 dollars.\n2 notebooks cost 2 * 5 = <<2*5=10>>10 dollars.\n"
     "Together they cost 6 + 10 = <<6+10=16>>16 dollars.\n#### 16"),
    ("Maria reads 12 pages a day. How many pages does she read in a week?",
     "A week has 7 days, so she reads 12 * 7 = <<12*7=84>>84 pages.\n#### 84"),
    ("A bus has 40 seats. 25 people get on, then 8 get off. How many seats are empty?",
     "After the stops there are 25 - 8 = <<25-8=17>>17 people.\n40 - 17 = <<40-17=23>>23 seats are empty.\n#### 23"),
    ("Sam saves 6 dollars each week. How many weeks does he need to save 54 dollars?",
     "He needs 54 / 6 = <<54/6=9>>9 weeks.\n#### 9"),
    ("A garden has 5 rows of 8 tulips. Half of the tulips are red. How many red tulips are there?",
     "There are 5 * 8 = <<5*8=40>>40 tulips.\nHalf of them is 40 / 2 = <<40/2=20>>20.\n#### 20"),
    ("Lena buys 4 packs of 6 eggs and breaks 3. How many eggs are not broken?",
     "She buys 4 * 6 = <<4*6=24>>24 eggs.\n24 - 3 = <<24-3=21>>21 are not broken.\n#### 21"),
    ("A train travels 60 miles an hour for 3 hours, then 40 miles an hour for 2 hours. How far does it go?",
     "First 60 * 3 = <<60*3=180>>180 miles, then 40 * 2 = <<40*2=80>>80 miles.\n"
     "In all 180 + 80 = <<180+80=260>>260 miles.\n#### 260"),
]


def write(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    return path
