#!/bin/sh
# Three metrics; `reward` is the one Harbor's single number reads.
expected="1 2 Fizz 4 Buzz Fizz 7 8 Fizz Buzz 11 Fizz 13 14 FizzBuzz"
got=$(sh /app/fizz.sh 2>/dev/null | tr '\n' ' ' | sed 's/ $//')
lines=$(sh /app/fizz.sh 2>/dev/null | wc -l)
correct=0; [ "$got" = "$expected" ] && correct=1
length=0; [ "$lines" = 15 ] && length=1
executable=0; [ -x /app/fizz.sh ] && executable=1
echo "{\"reward\": $correct, \"length\": $length, \"executable\": $executable}" > /logs/verifier/reward.json
echo 0 > /logs/verifier/reward.txt  # reward.json wins
