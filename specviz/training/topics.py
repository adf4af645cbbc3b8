"""Word starts that stand for the topics of the held-out, benchmark and unseen prompt sets, and `topic_hits`, which
finds a prompt that names one.

Why a prompt written by hand (data/prompts_written.txt) must not name them: it may share a form with those sets ("Write
a story about ..."), never a topic. Training on a story about another robot or a recipe for another curry would
flatter the held-out alpha the draft is judged by. assets/prompts/unseen.txt is stricter still: its 40 prompts are on
topics no teacher prompt touches, because the held-out set's topics are in the teacher data (its prompts are not, but
"What are some breakfast ideas?" is, beside "What are some healthy breakfast ideas?"), so alpha there flatters a
draft; the unseen set measures it on new ground.

Each dictionary maps a prompt (or a group of them) to its word starts, comma-separated; a word start matches at the
start of a word ("vaccin" finds "vaccine" and "vaccination"), case-insensitively. tests/test_data.py holds every
teacher prompt to these lists; specviz.training.filter_prompts drops a new hand-written prompt that names one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Word starts that stand for a topic of a held-out or benchmark prompt, by the prompt.
HELD_OUT_TOPICS = {
    "a limerick about a clumsy robot; a little robot who wanted to see the sea": "robot",
    "How do I fix a flat bicycle tyre?": "bicycle, cycling",
    "a bedtime story about a sleepy moon; How can I improve my sleep?": "bedtime, sleep?",
    "a village bakery's prize for its sourdough (summarise)": "bakery, baker, sourdough",
    "the recipe for the best chicken curry": "curry",
    "Describe a sunset over the ocean.": "sunset",
    "the planets in order; the first family to live on Mars": "planet, mars",
    "How do vaccines train the immune system?": "vaccin, immun",
    "Write a short story about a dragon who is afraid of the dark.": "dragon",
    "the code set": "linked list, tuple, palindrome, fibonacci, decorator, pandas",
    "one word each": "purr, gravity, tide, photosynthesis, black hole, volcan, honeybee, inflation, democracy, "
    "camping, airplane, aeroplane, interview, first impression, breakfast, second language, foreign language, "
    "internet, wi-fi, vpn, exercis, cinderella",
}

# assets/prompts/unseen.txt: its 40 prompts, by the word starts after each.
UNSEEN_TOPICS = {
    "What is the Doppler effect?": "doppler",
    "Tell me about the Trans-Siberian Railway.": "trans-siberian",
    "How do I get rid of limescale in a toilet?": "limescale",
    "Write a Python function that computes the Levenshtein distance between two strings.": "levenshtein, edit distance",
    "Tell me a story about a hermit crab looking for a new shell.": "hermit crab",
    "Give me tips for running a garage sale.": "garage sale, yard sale",
    "What is the placebo effect?": "placebo",
    "Who was Ibn Battuta?": "battuta",
    "How do I clean white sneakers?": "sneaker",
    "Write a C function that counts the set bits in an integer.": "set bits, popcount",
    "Write a story about a girl who finds a talking pebble.": "pebble",
    "Give me five tips for reading aloud to a class.": "reading aloud, read aloud",
    "Why do we get brain freeze from ice cream?": "brain freeze",
    "What is the Okavango Delta?": "okavango",
    "How do I tie a bowline knot?": "bowline",
    "Explain what a mutex is, with a short example.": "mutex",
    "Tell me a story about a raccoon who runs a lost-and-found office.": "raccoon",
    "Give me tips for writing a eulogy.": "eulog",
    "How are pearls formed?": "pearl",
    "Who was Hedy Lamarr?": "lamarr",
    "How do I pick a ripe watermelon?": "watermelon",
    "Write a regular expression that matches a UK postcode.": "postcode",
    "Write a funny story about a walrus who learns to knit.": "walrus",
    "How do cuckoos trick other birds into raising their chicks?": "cuckoo",
    "Tell me about the Faroe Islands.": "faroe",
    "How do I remove a splinter?": "splinter",
    "Explain what a closure is in JavaScript, with an example.": "closure",
    "Write a haiku about a heron.": "heron",
    "How does carbon dating work?": "carbon dating, radiocarbon",
    "Tell me about the Tower of London.": "tower of london",
    "How do I tell if an avocado is ripe?": "avocado",
    "Write a SQL query that finds the students enrolled in more than three courses.": "enrol",
    "Write an ode to a pencil sharpener.": "sharpener",
    "How do fireflies make light?": "firefl",
    "How do I use chopsticks?": "chopstick",
    "How does quicksand work?": "quicksand",
    "What is the Fermi paradox?": "fermi",
    "How does a fire extinguisher put out a fire?": "extinguisher",
    "How do hearing aids work?": "hearing aid",
    "How does a yo-yo come back up?": "yo-yo, yoyo",
}


def topic_hits(prompts: Iterable[str], topics: dict[str, str]) -> list[tuple[str, str]]:
    """(prompt, the word start it holds) for each prompt naming one of `topics`' word starts (comma-separated)."""
    stems = [t.strip() for words in topics.values() for t in words.split(",")]
    pattern = re.compile("|".join(r"\b" + re.escape(t) for t in stems))
    return [(p, m.group()) for p in prompts if (m := pattern.search(p.lower()))]
