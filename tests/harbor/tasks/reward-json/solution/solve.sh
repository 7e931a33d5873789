#!/bin/sh
cat > /app/fizz.sh <<'SH'
#!/bin/sh
i=1
while [ $i -le 15 ]; do
  if [ $((i % 15)) = 0 ]; then echo FizzBuzz; elif [ $((i % 3)) = 0 ]; then echo Fizz; elif [ $((i % 5)) = 0 ]; then echo Buzz; else echo $i; fi
  i=$((i + 1))
done
SH
chmod +x /app/fizz.sh
