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
