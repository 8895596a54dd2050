/* liblz4 on the same pages as the tier's lz4 rows (side by side):
   cargo run --release -p pagefold-tier --example dump_pages -- text /tmp/text.bin
   gcc -O2 -o /tmp/lz4probe crates/tier/probes/liblz4.c -l:liblz4.so.1 && /tmp/lz4probe /tmp/text.bin */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int LZ4_compress_default(const char* src, char* dst, int srcSize, int dstCapacity);
int LZ4_decompress_safe(const char* src, char* dst, int compressedSize, int dstCapacity);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  FILE*f=fopen(argv[1],"rb"); static char in[256*4096]; fread(in,1,sizeof in,f); fclose(f);
  static char out[256][5000]; int len[256]; static char back[4096];
  double tc[41],td[41]; long total=0;
  for(int r=0;r<42;r++){
    double s=now(); for(int i=0;i<256;i++) len[i]=LZ4_compress_default(in+i*4096,out[i],4096,5000); double e=now();
    double s2=now(); for(int i=0;i<256;i++) LZ4_decompress_safe(out[i],back,len[i],4096); double e2=now();
    if(r>0){tc[r-1]=(e-s)/256; td[r-1]=(e2-s2)/256;}
  }
  for(int i=0;i<256;i++) total+=len[i];
  qsort(tc,41,sizeof(double),cmp); qsort(td,41,sizeof(double),cmp);
  printf("%s liblz4: %.0f B, compress %.2f us, decompress %.2f us\n",argv[1],(double)total/256,tc[20],td[20]);
}
