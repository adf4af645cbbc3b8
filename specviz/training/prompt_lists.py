"""Topic and filler lists for build_prompts.py: everyday subjects a small chat model is asked about.

Hand-written, broad on purpose (nature, science, places, the body, history, money, work, home, food, sport,
arts, technology, language), and kept apart from the held-out sets in assets/prompts/ by the builder's filter.
"""

# fmt: off
TOPICS = (
    # nature and earth
    "the water cycle", "volcanoes", "earthquakes", "rainbows", "ocean tides", "glaciers", "hurricanes", "tornadoes",
    "deserts", "coral reefs", "the Amazon rainforest", "rivers", "caves", "fog", "lightning", "snowflakes",
    "the seasons", "soil", "fossils", "tsunamis", "wetlands", "the ozone layer", "monsoons", "geysers",
    "sand dunes", "icebergs", "the Great Barrier Reef", "the Sahara", "the Himalayas", "the Nile",
    # living things
    "honey bees", "penguins", "whales", "spiders", "mushrooms", "octopuses", "ants", "bats", "owls", "sharks",
    "dolphins", "elephants", "butterflies", "migrating birds", "frogs", "wolves", "camels", "seeds", "cacti",
    "bamboo", "moss", "algae", "bacteria", "hibernation", "camouflage", "food chains", "pollination",
    "evolution", "extinction", "animal migration", "bird songs", "tree rings", "the giant panda",
    # space and physics
    "the solar system", "the moon's phases", "black holes", "comets", "the Milky Way", "Mars", "Jupiter",
    "satellites", "the Big Bang", "eclipses", "meteor showers", "the speed of light", "magnets", "friction",
    "sound waves", "electricity", "static electricity", "heat and temperature", "atoms", "the periodic table",
    "nuclear energy", "lasers", "mirrors", "lenses", "buoyancy", "pressure", "inertia", "energy",
    "radio waves", "X-rays", "the International Space Station", "telescopes", "rockets", "the northern lights",
    # the body and health
    "the human heart", "the immune system", "the human brain", "sleep", "dreams", "muscles", "bones",
    "the skin", "digestion", "vitamins", "blood types", "allergies", "the common cold", "hydration",
    "posture", "stretching", "meditation", "stress", "memory", "the eyes", "hearing", "taste", "teeth",
    "fever", "antibiotics", "first aid", "calories", "fibre in food", "protein",
    # history and society
    "the Roman Empire", "ancient Egypt", "the pyramids", "the printing press", "the French Revolution",
    "the Silk Road", "the Industrial Revolution", "the Vikings", "the Renaissance", "ancient Greece",
    "the Olympic Games", "the Great Wall of China", "the Middle Ages", "castles", "knights", "the Aztecs",
    "the Maya", "the Ottoman Empire", "the moon landing", "the invention of writing", "the Bronze Age",
    "libraries", "museums", "elections", "taxes", "the United Nations", "human rights", "city planning",
    "public transport", "the postal service", "newspapers", "maps", "calendars", "time zones",
    # money and work
    "compound interest", "the stock market", "inflation", "budgeting", "credit scores", "insurance",
    "small businesses", "supply and demand", "interest rates", "saving for retirement", "cryptocurrency",
    "remote work", "job interviews", "teamwork", "leadership", "negotiation", "customer service",
    "marketing", "advertising", "entrepreneurship", "productivity", "time management", "public speaking",
    # home, food and everyday life
    "bread baking", "chocolate", "coffee", "tea", "cheese making", "fermentation", "spices", "olive oil",
    "rice", "pasta", "vegetarian cooking", "food preservation", "composting", "recycling", "houseplants",
    "laundry", "home insulation", "candles", "pottery", "knitting", "woodworking", "gardening",
    "bicycles", "electric cars", "road safety", "camping", "hiking", "swimming", "yoga", "chess",
    "football", "basketball", "tennis", "cycling races", "marathons", "board games", "puzzles",
    # arts and language
    "jazz music", "classical music", "the piano", "the violin", "rock music", "photography", "painting",
    "sculpture", "poetry", "theatre", "film making", "animation", "comics", "architecture", "fashion",
    "grammar", "punctuation", "idioms", "sign language", "learning a language", "the English alphabet",
    "storytelling", "myths", "fairy tales", "Shakespeare", "the novel", "calligraphy", "dance",
    # technology and computing
    "the internet", "email", "passwords", "encryption", "databases", "operating systems", "video games",
    "smartphones", "batteries", "solar panels", "wind turbines", "renewable energy", "light bulbs",
    "the telephone", "computers", "the cloud", "artificial intelligence", "robots", "3D printing", "GPS",
    "Wi-Fi", "Bluetooth", "open source software", "version control", "programming", "algorithms",
    "binary numbers", "computer viruses", "spreadsheets", "search engines", "social media", "web browsers",
    "QR codes", "barcodes", "microwaves", "refrigerators", "elevators", "bridges", "tunnels", "dams",
    # maths and thinking
    "prime numbers", "fractions", "percentages", "probability", "statistics", "geometry", "the number pi",
    "infinity", "zero", "negative numbers", "graphs", "logic", "the scientific method", "critical thinking",
    "climate change", "DNA", "vaccines", "photosynthesis", "the greenhouse effect", "plastic pollution",
)

ACTIONS = (
    "learn to cook", "save money each month", "stay focused while studying", "plant a vegetable garden",
    "write a good resume", "prepare for a long flight", "keep a houseplant alive", "make friends in a new city",
    "learn to play the guitar", "organise my desk", "reduce my screen time", "train a puppy",
    "prepare for a marathon", "back up my phone", "write a cover letter", "clean a laptop keyboard",
    "memorise a speech", "start a journal", "make homemade pizza", "brew a good cup of tea",
    "choose a good book", "paint a room", "ask for a raise", "learn a new word every day", "bake sourdough bread",
    "change a car tyre", "set up a home Wi-Fi network", "write a short story", "learn to swim as an adult",
    "make a budget spreadsheet", "start running", "meditate", "improve my handwriting", "grow herbs indoors",
    "make cold brew coffee", "remove a coffee stain", "plan a road trip", "pack a suitcase efficiently",
    "learn to touch type", "start a podcast", "take better photos with my phone", "make a paper airplane",
    "fold a fitted sheet", "sharpen a kitchen knife", "make a smoothie", "cook rice on the stove",
    "boil an egg perfectly", "make pancakes", "write a thank-you letter", "prepare for an exam",
    "learn a programming language", "install Python", "use git for the first time", "write my first website",
    "keep a conversation going", "say no politely", "give a presentation", "run a meeting",
    "teach a child to ride a bike", "care for a cat", "choose a laptop", "clean my oven", "unclog a sink",
    "hang a picture straight", "assemble flat-pack furniture", "make a compost heap", "attract birds to my garden",
    "learn to draw", "start knitting", "write a poem", "read faster", "take notes in a lecture",
    "memorise a phone number", "wake up earlier", "drink more water", "eat more vegetables", "stop procrastinating",
    "study for a driving test", "apply for a passport", "write a speech for a wedding", "plan a birthday party",
    "host a dinner party", "set up a fish tank", "teach myself chess", "solve a Rubik's cube", "juggle",
    "whistle", "tie a tie", "iron a shirt", "sew on a button", "make a cup of hot chocolate", "make lemonade",
    "organise my email inbox", "create a strong password", "speed up an old computer", "learn to skateboard",
    "choose running shoes", "prepare for a job interview", "negotiate a lower rent", "write a complaint letter",
    "make a family tree", "start a book club", "volunteer in my community", "reduce food waste",
    "save energy at home", "insulate a window", "learn basic first aid", "calm down before a test",
    "build a birdhouse", "make a scrapbook", "learn to dance", "start a vegetable soup", "make a salad dressing",
    "store fresh herbs", "pick a ripe melon", "make yoghurt at home", "read a map", "use a compass",
    "build a campfire safely", "set up a tent", "learn sign language", "write a haiku", "design a logo",
    "learn to type in a new keyboard layout", "keep a plant-based diet", "care for a sourdough starter",
)

ADVICE = (
    "I just moved to a new city and don't know anyone.", "My roommate never does the dishes.",
    "I have two job offers and can't decide.", "I feel tired every afternoon at work.",
    "My friend forgot my birthday and I feel hurt.", "I want to change careers at 35.",
    "I get nervous when I speak in meetings.", "My teenager spends all day on the phone.",
    "I keep putting off my homework.", "I have a big exam in two weeks and haven't started.",
    "My neighbour plays loud music at night.", "I want to ask my boss for more responsibility.",
    "I spend too much money on takeaway food.", "I can't fall asleep before 2 a.m.",
    "My dog barks whenever I leave the house.", "I want to start exercising but I have no time.",
    "I made a mistake at work and I'm worried.", "My parents want me to study something I don't like.",
    "I feel lonely working from home.", "I have too many tabs open and can't focus.",
    "My team member takes credit for my work.", "I want to read more books this year.",
    "I'm nervous about my first day at a new job.", "My small business is losing customers.",
    "I can't stick to a budget.", "My plants keep dying.", "I want to be more confident.",
    "I argued with my best friend.", "I'm going travelling alone for the first time.",
    "I want to learn to code but don't know which language.", "My code works but is slow.",
    "I'm overwhelmed by emails.", "I want to eat healthier on a small budget.",
    "My child is afraid of the dark.", "I get bored easily at my job.", "I'm moving in with my partner.",
    "I want to make my small flat feel bigger.", "I'm retiring next year.", "I want to get better at chess.",
    "My presentation is tomorrow and I'm not ready.", "I want to write a novel.", "I can't stop checking my phone.",
    "I have a long commute every day.", "I forget people's names right after meeting them.",
    "My old laptop is very slow.", "I want to save for a holiday.", "I keep losing my keys.",
    "I have trouble waking up in the morning.", "I'm starting university next month.",
    "My colleague talks over me in meetings.", "I want to learn to cook for my family.",
    "I'm planning my first vegetable garden.", "I have a job interview on Friday.",
    "I want to stop biting my nails.", "I'm hosting my in-laws for a week.", "My cat scratches the sofa.",
    "I want to get fit for a hiking trip.", "I'm learning Spanish and stuck at the same level.",
    "I find it hard to say no to extra work.", "I'm a new manager of a small team.",
    "I want to start a side project.", "My friends always choose the restaurant.",
    "I want to run my first 5 km race.", "I need to give feedback to a colleague.",
    "I feel stuck in my career.", "I have a lot of clutter at home.", "I want to wake up earlier.",
    "I'm buying my first car.", "I'm worried about a presentation in English.",
    "I want to spend less time on social media.", "I need to write a difficult email.",
    "I'm adopting a rescue dog.", "My kids fight over screen time.", "I want to learn photography.",
    "My garden is full of weeds.", "I'm going to a wedding where I know nobody.",
    "I want to plan a surprise for my partner.", "I need to study while working full time.",
    "I'm nervous about flying.", "I keep forgetting to drink water.", "I want to make my CV stand out.",
    "I want to volunteer but don't know where.", "My house is always cold in winter.",
    "I want to become a morning person.", "My brother asked to borrow money.", "I'm learning to drive.",
    "I can't decide what to study.", "I want to build better habits.", "I feel anxious on Sunday evenings.",
    "I need to lose a few kilos for my health.", "My landlord won't fix the heating.",
    "I'm organising a team event.", "I want to learn an instrument as an adult.",
    "My friend always cancels plans at the last minute.", "I'm going to a job fair.",
    "I want to ask someone out.", "I'm planning a move abroad.", "I want to write better emails.",
)

GOALS = (
    "working from home", "learning a language", "staying healthy", "studying online", "running a small shop",
    "keeping a clean house", "raising a toddler", "managing a team", "writing every day", "saving for a house",
    "travelling on a budget", "living with roommates", "starting a garden", "learning to program",
)

CREATIVE_FORMS = (
    "short poem", "haiku", "limerick", "four-line poem", "sonnet", "song chorus", "rhyming couplet",
    "free-verse poem", "short story", "diary entry", "letter", "bedtime story",
)

SUBJECTS = (
    "the sea", "the wind", "a rainy afternoon", "spring flowers", "the mountains", "a quiet library", "friendship",
    "a city at night", "autumn leaves", "snow", "the stars", "an old lighthouse", "a cat", "the first day of school",
    "a train journey", "a summer storm", "the desert", "a garden at dawn", "a forgotten umbrella", "grandmother's kitchen",
    "the last day of summer", "a lost key", "a busy market", "a snail", "the moon over a lake", "an empty playground",
    "a lighthouse keeper's night", "a paper boat", "the smell of rain", "a long-distance friendship", "a bakery at 5 a.m.",
    "a thunderstorm", "an old piano", "a broken clock", "a river in winter", "a kite", "a fox in the city",
    "waiting for a bus", "moving house", "a new puppy", "the first snow", "a sunflower field", "a campfire",
    "a hot air balloon", "a street musician", "Monday mornings", "a quiet Sunday", "the ocean floor",
    "a rainforest at night", "an astronaut's view of Earth", "a tiny robot", "a cup of tea", "homework",
    "a village festival", "a lost letter", "the last leaf on a tree", "a secret garden", "the city bus",
)

CHARACTERS = (
    "a robot", "a pirate", "a snowman", "a girl who can talk to birds", "an astronaut", "a talking tree",
    "a shy ghost", "a detective cat", "a baker", "two friends", "a boy", "a lighthouse keeper", "a teacher",
    "a little mouse", "a dragon", "a grandmother", "a fisherman", "a young inventor", "a lonely giant",
    "a clumsy wizard", "a lost puppy", "a brave knight", "an old sailor", "a curious fox", "a tiny turtle",
    "a librarian", "a farmer", "a street cat", "a princess who hates castles", "a penguin", "a bus driver",
    "a retired spy", "a nervous superhero", "a talking bicycle", "a family of rabbits", "a musician",
    "a gardener", "an owl", "a bear cub", "a crow", "a clockmaker", "a magic paintbrush", "a mermaid",
)

TWISTS = (
    "who learns to paint", "searching for treasure", "who comes alive at night", "lost in a forest",
    "who is afraid of the dark", "who finds a secret door", "on a journey to the sea", "who makes a new friend",
    "who loses their voice", "who travels back in time", "who wins a baking contest", "who can't stop sneezing",
    "who discovers a hidden city", "on the first day of winter", "who has to keep a promise",
    "who finds a map in a bottle", "who wants to fly", "who helps a stranger",
)

PLACES = (
    "a busy train station", "a quiet beach at dawn", "a mountain village", "a night market", "a rainforest",
    "an old castle", "a snowy forest", "a desert oasis", "a harbour at sunset", "a crowded stadium",
    "a tiny island", "a school on the last day of term", "a farm in spring", "an underground cave",
    "a space station", "a library at midnight", "a busy kitchen", "a flower market", "a frozen lake",
)

THINGS = (
    "fruits", "vegetables that are easy to grow", "animals that live in the ocean", "countries in Europe",
    "countries in Africa", "countries in South America", "famous scientists", "famous painters", "famous composers",
    "board games", "card games", "musical instruments", "programming languages", "ways to reduce stress",
    "hobbies you can do at home", "uses for baking soda", "inventions of the 1900s", "birds you can see in a city",
    "healthy snacks", "exercises you can do without equipment", "things to pack for a beach holiday",
    "questions to ask in a job interview", "ways to save energy at home", "books for teenagers",
    "classic films", "kitchen tools every cook needs", "herbs and what they are used for", "breakfast ideas",
    "dog breeds", "cat breeds", "dinosaurs", "planets and one fact about each", "gemstones", "types of clouds",
    "types of rock", "ancient wonders of the world", "rivers in Asia", "mountains over 8000 metres",
    "sports played with a ball", "Olympic sports", "winter sports", "indoor plants that need little light",
    "ways to be kind to strangers", "study techniques", "common English idioms", "words that are hard to spell",
    "synonyms for happy", "things to do on a rainy day", "jobs that did not exist 30 years ago",
    "signs of a good friend", "Python built-in functions", "Linux commands every beginner should know",
    "keyboard shortcuts", "git commands", "SQL keywords", "HTML tags", "data structures", "sorting algorithms",
    "units of measurement", "famous bridges", "famous buildings", "famous explorers", "famous inventors",
    "renewable energy sources", "ways to reuse glass jars", "camping essentials", "first aid kit items",
    "spices used in Indian cooking", "Italian dishes", "Japanese foods", "Mexican dishes", "types of pasta",
    "types of bread", "types of cheese", "teas from around the world", "fruits high in vitamin C",
    "animals that hibernate", "nocturnal animals", "insects that help gardens", "trees that lose their leaves",
    "desert animals", "Arctic animals", "reptiles", "mammals that live in water", "endangered animals",
    "mistakes new drivers make", "ways to improve handwriting", "ways to learn vocabulary",
    "podcast topic ideas", "blog post ideas about cooking", "birthday gift ideas for a ten-year-old",
    "team-building activities", "icebreaker questions", "ways to start a story", "rhyming words for light",
    "things to check before a long drive", "habits of successful students", "good questions to ask a doctor",
    "reasons to learn history", "benefits of walking", "benefits of reading", "tips for writing clearly",
    "colours of the rainbow and what they mean", "shapes and their properties", "simple science experiments",
    "math games for kids", "ways to practise mental arithmetic", "famous speeches", "famous poems",
    "instruments in an orchestra", "dances from around the world", "festivals around the world",
    "languages spoken in India", "things that are made from wood", "things that are magnetic",
    "simple machines", "sources of protein", "foods rich in iron", "ways to stay cool in summer",
    "ways to stay warm in winter", "household chores kids can do", "careers in science", "careers in art",
)

PAIRS = (
    ("cats", "dogs"), ("tea", "coffee"), ("weather", "climate"), ("viruses", "bacteria"), ("RAM", "storage"),
    ("a lake", "a sea"), ("renting", "buying a home"), ("trains", "planes"), ("books", "films"),
    ("Python", "JavaScript"), ("summer", "winter"), ("frogs", "toads"), ("stocks", "bonds"),
    ("butter", "margarine"), ("a crocodile", "an alligator"), ("a violin", "a viola"), ("a moth", "a butterfly"),
    ("a comet", "an asteroid"), ("a hurricane", "a typhoon"), ("speed", "velocity"), ("mass", "weight"),
    ("a debit card", "a credit card"), ("a virus", "a worm in computing"), ("HTTP", "HTTPS"), ("Linux", "Windows"),
    ("SQL", "NoSQL databases"), ("a list", "an array"), ("a compiler", "an interpreter"), ("Git", "GitHub"),
    ("machine learning", "traditional programming"), ("walking", "running"), ("yoga", "pilates"),
    ("email", "instant messaging"), ("paper books", "e-books"), ("city life", "country life"),
    ("solar power", "wind power"), ("nuclear power", "coal power"), ("electric cars", "hybrid cars"),
    ("the Sun", "the Moon"), ("Mars", "Venus"), ("a star", "a planet"), ("an ocean", "a sea"),
    ("a tortoise", "a turtle"), ("a rabbit", "a hare"), ("a dolphin", "a shark"), ("bees", "wasps"),
    ("baking", "frying"), ("brown rice", "white rice"), ("a latte", "a cappuccino"), ("a baguette", "a croissant"),
    ("football", "rugby"), ("tennis", "badminton"), ("chess", "checkers"), ("a poem", "a song"),
    ("a novel", "a short story"), ("painting", "drawing"), ("jazz", "blues"), ("opera", "musicals"),
    ("democracy", "monarchy"), ("a city", "a town"), ("saving", "investing"), ("a loan", "a mortgage"),
    ("a resume", "a cover letter"), ("working from home", "working in an office"), ("a manager", "a leader"),
    ("a laptop", "a desktop computer"), ("a tablet", "a smartphone"), ("Wi-Fi", "mobile data"),
    ("a router", "a modem"), ("a CPU", "a GPU"), ("an SSD", "a hard drive"), ("a bug", "a feature"),
    ("a function", "a method"), ("a class", "an object"), ("recursion", "iteration"), ("TCP", "UDP"),
    ("a stack", "a queue"), ("a set", "a dictionary"), ("JSON", "XML"), ("HTML", "CSS"), ("C", "C++"),
    ("Java", "Kotlin"), ("Go", "Rust"), ("unit tests", "integration tests"), ("a library", "a framework"),
    ("a mountain", "a hill"), ("a river", "a stream"), ("a forest", "a jungle"), ("a cave", "a mine"),
    ("a diary", "a blog"), ("radio", "podcasts"), ("a museum", "a gallery"), ("a bus", "a tram"),
    ("cycling", "swimming"), ("a vegetarian", "a vegan diet"), ("sugar", "honey"), ("an apple", "an orange"),
    ("a herb", "a spice"), ("a plant cell", "an animal cell"), ("DNA", "RNA"), ("an atom", "a molecule"),
    ("a solid", "a liquid"), ("heat", "temperature"), ("AC", "DC electricity"), ("a generator", "a motor"),
    ("a simile", "a metaphor"), ("affect", "effect"), ("British English", "American English"),
    ("a fable", "a fairy tale"), ("a myth", "a legend"), ("ancient Greece", "ancient Rome"),
    ("the Stone Age", "the Bronze Age"), ("a knight", "a samurai"), ("a castle", "a palace"),
    ("optimism", "realism"), ("introverts", "extroverts"), ("a habit", "a routine"), ("a goal", "a dream"),
)

LANGS = ("Python", "JavaScript", "TypeScript", "C", "C++", "Java", "Rust", "Go", "Ruby", "bash")

CODE_TASKS = (
    "checks if a number is prime", "reverses a string", "counts the vowels in a string",
    "finds the largest element in a list", "sorts a list using bubble sort", "merges two sorted lists",
    "removes duplicates from a list", "computes the factorial of a number", "checks if two strings are anagrams",
    "converts Celsius to Fahrenheit", "reads a file and prints its lines", "flattens a nested list",
    "returns the n-th Fibonacci number iteratively", "validates an email address with a simple check",
    "finds the second largest number in a list", "counts how often each word appears in a text",
    "capitalises the first letter of every word", "computes the average of a list of numbers",
    "checks whether a year is a leap year", "converts a number to binary", "finds the greatest common divisor",
    "returns the longest word in a sentence", "checks if a list is sorted", "rotates a list by k positions",
    "finds all even numbers in a list", "sums the digits of a number", "generates a random password",
    "converts a string to title case", "removes punctuation from a string", "finds the index of an item",
    "implements binary search", "implements a stack with push and pop", "implements a simple queue",
    "counts the lines in a file", "returns the intersection of two lists", "transposes a matrix",
    "computes the dot product of two vectors", "checks for balanced parentheses", "converts Roman numerals to integers",
    "formats a number with thousands separators", "returns the median of a list", "chunks a list into pieces of size n",
    "merges two dictionaries", "inverts a dictionary", "sorts a list of dictionaries by a key",
    "parses a date string", "returns today's date as text", "computes compound interest", "simulates a dice roll",
    "shuffles a deck of cards", "checks if a string contains only digits", "truncates a string to n characters",
    "counts the uppercase letters in a string", "finds the minimum and maximum of a list in one pass",
    "computes the power set of a list", "prints a multiplication table", "draws a triangle of stars",
    "converts kilometres to miles", "computes the area of a circle", "returns the n largest items of a list",
    "zips two lists into a dictionary", "retries a function up to three times", "caches the results of a function",
    "measures how long a function takes", "reads a CSV file into a list of rows", "writes a list of rows to a CSV file",
    "downloads a web page and prints its title", "walks a directory and lists all files",
    "finds duplicate files by size", "splits a full name into first and last name", "masks all but the last four digits",
    "checks whether a number is a palindrome", "generates the first n prime numbers", "implements FizzBuzz",
)

EDITS = (
    "Add type hints to this function", "Add a docstring to this function", "Explain what this function does",
    "Rename the variables in this function to clearer names", "Write unit tests for this function",
    "Find a possible bug or edge case in this function", "Rewrite this function to be easier to read",
    "Convert this Python function to JavaScript", "Explain this code line by line", "Suggest improvements to this code",
    "Add comments to this code", "What does this function return for an empty input", "Simplify this function",
    "Add error handling to this function", "Describe the time complexity of this function",
)

SUMMARIES = (
    "Summarise this text", "Summarise this text in one sentence", "Summarise this text in two sentences",
    "Give me the main points of this text as bullet points", "Summarise this for a child",
    "Write a one-line summary of this", "What is this text about? Answer briefly",
    "Summarise this paragraph in plain English", "TL;DR this text", "List the key facts in this text",
)

REWRITES = (
    "Rewrite this text in simpler words", "Rewrite this text for a ten-year-old", "Make this text more formal",
    "Make this text friendlier", "Rewrite this as a short email to a colleague", "Turn this into a tweet",
    "Paraphrase this text", "Rewrite this text in the first person", "Shorten this text by half",
    "Rewrite this text as three bullet points", "Translate this text into French", "Rewrite this as a short poem",
    "Fix the grammar and improve the style of this text", "Rewrite this text as a news headline and a lead sentence",
)
# fmt: on
