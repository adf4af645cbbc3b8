// amx_products.c: the built-in target's 211 products (30 layers of q, k, v, o, gate, up, down, then the 49,152-row
// output layer; random weights of the same shapes, 538 MB, cycled so they stream from memory) timed at 1-16 rows of
// x, two threads, as float32 panels with AVX-512 multiply-adds (the layout of few_rows.c's panels, simplified) and as
// float32 weights split into two bfloat16 parts on AMX tiles (hi . hi + lo . hi + hi . lo, float32 sums). A measuring
// program for a CPU with AMX (Sapphire Rapids and later Xeons), not part of the package; the kernel itself is on the
// branch wip/amx-tiles (few_rows.c, weight type 8). BENCHMARKS.md, "The Xeon with AMX again".
//
//   gcc -O3 -fopenmp -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 scripts/amx_products.c -o /tmp/amx_products -lm
//   /tmp/amx_products      # prints the output layer's error against float32, then ms per pass, best of 5, twice
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette_id, start_row, r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint16_t bf(float f){uint32_t u;memcpy(&u,&f,4);u+=0x7fff+((u>>16)&1);return u>>16;}
static float fb(uint16_t h){uint32_t u=(uint32_t)h<<16;float f;memcpy(&f,&u,4);return f;}
typedef struct { long N,K; float* p; uint16_t *hi,*lo; } mat;
__attribute__((target("avx512f"))) static void pan(const float*w,const float*x,long M,long K,long N,float*y,long p0,long p1){
  for(long p=p0;p<p1;p++){ __m512 acc[16]; for(int m=0;m<M;m++)acc[m]=_mm512_setzero_ps();
    for(long k=0;k<K;k++){ __m512 wv=_mm512_loadu_ps(w+(p*K+k)*16); for(int m=0;m<M;m++)acc[m]=_mm512_fmadd_ps(wv,_mm512_set1_ps(x[m*K+k]),acc[m]);}
    for(int m=0;m<M;m++)_mm512_storeu_ps(y+m*N+p*16,acc[m]);}
}
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16"))) static void amx(const uint16_t*hi,const uint16_t*lo,const uint16_t*xh,const uint16_t*xl,long M,long K,long N,float*y,long p0,long p1){
  cfg_t c; memset(&c,0,sizeof c); c.palette_id=1;
  c.rows[0]=M; c.colsb[0]=64;
  c.rows[1]=M; c.colsb[1]=64; c.rows[2]=M; c.colsb[2]=64;
  c.rows[3]=16; c.colsb[3]=64; c.rows[4]=16; c.colsb[4]=64;
  c.rows[5]=M; c.colsb[5]=64; c.rows[6]=16; c.colsb[6]=64; c.rows[7]=16; c.colsb[7]=64;
  __asm__ volatile("ldtilecfg %0" ::"m"(c));  // not _tile_loadconfig: GCC 12's lets the stores above be dropped
  long C=K/32;
  long p=p0;
  for(;p+2<=p1;p+=2){ _tile_zero(0); _tile_zero(5);
    const uint16_t *bh=hi+p*C*512,*bl=lo+p*C*512,*bh2=bh+C*512,*bl2=bl+C*512;
    for(long c2=0;c2<C;c2++){
      _tile_loadd(1,xh+c2*32,K*2); _tile_loadd(2,xl+c2*32,K*2);
      _tile_loadd(3,bh+c2*512,64); _tile_loadd(4,bl+c2*512,64);
      _tile_loadd(6,bh2+c2*512,64); _tile_loadd(7,bl2+c2*512,64);
      _tile_dpbf16ps(0,1,3); _tile_dpbf16ps(0,2,3); _tile_dpbf16ps(0,1,4);
      _tile_dpbf16ps(5,1,6); _tile_dpbf16ps(5,2,6); _tile_dpbf16ps(5,1,7);
    }
    _tile_stored(0,y+p*16,N*4); _tile_stored(5,y+p*16+16,N*4);
  }
  for(;p<p1;p++){ _tile_zero(0);
    const uint16_t *bh=hi+p*C*512,*bl=lo+p*C*512;
    for(long c2=0;c2<C;c2++){
      _tile_loadd(1,xh+c2*32,K*2); _tile_loadd(2,xl+c2*32,K*2);
      _tile_loadd(3,bh+c2*512,64); _tile_loadd(4,bl+c2*512,64);
      _tile_dpbf16ps(0,1,3); _tile_dpbf16ps(0,2,3); _tile_dpbf16ps(0,1,4);
    }
    _tile_stored(0,y+p*16,N*4);
  }
  _tile_release();
}
int main(int argc,char**argv){
  syscall(SYS_arch_prctl,0x1023,18);
  long shapes[][2]={{576,576},{192,576},{192,576},{576,576},{1536,576},{1536,576},{576,1536}};
  int L=30; int nm=L*7+1; mat*ms=calloc(nm,sizeof(mat)); long tot=0;
  srand(1);
  for(int i=0;i<nm;i++){ long N= i<L*7?shapes[i%7][0]:49152, K=i<L*7?shapes[i%7][1]:576; ms[i].N=N;ms[i].K=K;
    ms[i].p=aligned_alloc(64,N*K*4); ms[i].hi=aligned_alloc(64,N*K*2); ms[i].lo=aligned_alloc(64,N*K*2);
    float*w=malloc(N*K*4); for(long j=0;j<N*K;j++) w[j]=((rand()/(float)RAND_MAX)-0.5f)*0.1f;
    for(long n=0;n<N;n++)for(long k=0;k<K;k++){ float v=w[n*K+k]; long p=n/16,c=n%16;
      ms[i].p[(p*K+k)*16+c]=v; uint16_t h=bf(v); uint16_t l=bf(v-fb(h));
      long ch=k/32,kk=k%32; long off=((p*(K/32)+ch)*16+kk/2)*32+c*2+(kk%2);
      ms[i].hi[off]=h; ms[i].lo[off]=l; }
    free(w); tot+=N*K; }
  printf("params %ld M f32 %ld MB\n",tot/1000000,tot*4/1000000);
  float *x=malloc(16*1536*4),*y=malloc(16*49152*4),*y2=malloc(16*49152*4); uint16_t*xh=malloc(16*1536*2),*xl=malloc(16*1536*2);
  for(int i=0;i<16*1536;i++){x[i]=(rand()/(float)RAND_MAX)-0.5f; xh[i]=bf(x[i]); xl[i]=bf(x[i]-fb(xh[i]));}
  { mat*m=&ms[nm-1]; pan(m->p,x,4,m->K,m->N,y,0,m->N/16); amx(m->hi,m->lo,xh,xl,4,m->K,m->N,y2,0,m->N/16);
    double e=0,mx=0,s=0; for(long j=0;j<4*m->N;j++){double d=fabs(y[j]-y2[j]); e+=d; s+=fabs(y[j]); if(d>mx)mx=d;} printf("err mean %g max %g (mean |y| %g)\n",e/(4*m->N),mx,s/(4*m->N)); }
  int Ms[]={1,2,4,8,16};
  for(int rep=0;rep<2;rep++) for(int mi=0;mi<5;mi++){ int M=Ms[mi];
    for(int kind=0;kind<2;kind++){ double best=1e9;
      for(int r=0;r<5;r++){ double t0=now();
        for(int i=0;i<nm;i++){ mat*m=&ms[i]; long np=m->N/16;
          #pragma omp parallel num_threads(2)
          { int t=omp_get_thread_num(); long s=(np+1)/2, a=t*s, b=a+s<np?a+s:np;
            if(kind==0) pan(m->p,x,M,m->K,m->N,y,a,b); else amx(m->hi,m->lo,xh,xl,M,m->K,m->N,y,a,b);} }
        double t=now()-t0; if(t<best)best=t; }
      printf("M=%2d %s %.2f ms\n",M,kind?"amx ":"f32 ",best*1e3); } }
}
