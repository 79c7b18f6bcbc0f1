"""Short everyday questions the benchmarks send (answers are a sentence or two)."""

QUESTIONS = [
    "What is the capital of France?", "What color is the sky on a clear day?", "How many legs does a dog have?",
    "What do bees make?", "Why do leaves change color in autumn?", "What is the largest planet in our solar system?",
    "How do fish breathe under water?", "What is the boiling point of water?", "Who wrote Romeo and Juliet?",
    "What is the tallest animal in the world?", "Why is the ocean salty?", "How many days are in a leap year?",
    "What language is spoken in Brazil?", "What is the main ingredient of bread?", "How far away is the moon?",
    "What do plants need to grow?", "What is the fastest land animal?", "How many continents are there?",
    "What is ice made of?", "Where do penguins live?",
]

# Requests for a long spoken answer (``bench offline --seed001``: about 100 output tokens each). The thinker's
# system turn asks for brief answers; a question that names a length gets a paragraph from the instruct thinker.
LONG_QUESTIONS = [
    "Tell me a short story about a lighthouse keeper and a lost whale, in about eight sentences.",
    "Explain in about eight sentences how a bill becomes a law in the United States.",
    "Describe, in about eight sentences, how bread is made from wheat in the field to the loaf.",
    "In about eight sentences, explain why the seasons change over the year.",
    "Tell me, in about eight sentences, how the first people travelled to the moon and came back.",
    "In about eight sentences, describe a walk through a busy market in the morning.",
    "Explain in about eight sentences how bees make honey and why they need so many flowers.",
    "Describe in about eight sentences how a volcano forms and what happens when it erupts.",
    "Tell me in about eight sentences how to plan a good camping trip for a family.",
    "In about eight sentences, explain how the heart pumps blood around the body.",
]
